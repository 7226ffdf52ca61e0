"""The launchers that may have started a process, one row each, in Lightning's order of detection.

Ray and Kubeflow, which Lightning does not detect, come before SLURM, with the ``ClusterEnvironment`` the Trainer is
given. Each ``detect`` is Lightning's rule (tests/unit/test_launcher_table.py), read without importing Lightning.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

TORCHRUN = "torchrun"
LEGACY_LAUNCH = "torch.distributed.launch"
SLURM = "slurm"
KUBEFLOW = "kubeflow"
RAY = "ray"
LSF = "lsf"
MPI = "mpi"
#: Set by the CLI when it removed a legacy ``--local_rank``: torch.distributed.launch, not torchrun (both TorchElastic).
LEGACY_FLAG_ENV = "PROJECT_LEGACY_LAUNCH"

# What Ray Train sets in each worker (ray.train.torch's TorchConfig), beside the raylet's RAY_RAYLET_PID.
_RAY_WORKER_VARS = ("RAY_RAYLET_PID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
# What the Kubeflow training operator sets in each PyTorchJob pod (one process per pod); the kubelet, in every pod.
_KUBEFLOW_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
_KUBERNETES_VARS = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_PORT")
# Lightning's LSFEnvironment.detect: a jsrun launch.
_LSF_VARS = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE")
# What mpirun sets in each process: Open MPI's names, else MPICH's / Intel MPI's (PMI).
_MPI_NAMES = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def read_int(environ: Mapping[str, str], key: str) -> int | None:
    """The leading whole number of ``environ[key]`` (SLURM writes e.g. ``2(x3)``); ``None`` when unset or empty."""
    value = environ.get(key)
    if value is None or value == "":
        return None
    match = re.match(r"^\d+", value)
    return int(match.group(0)) if match else None


def read_ints(env: Mapping[str, str], **keys: str) -> dict[str, int | None]:
    """Each field from its variable, as :func:`read_int` reads it."""
    return {name: read_int(env, key) for name, key in keys.items()}


def _sizes(env: Mapping[str, str], world_key: str, local_key: str) -> dict[str, int | None]:
    """The world size, processes per node, and nodes (none for an uneven placement: Ray's, MPI's)."""
    world, local = read_int(env, world_key), read_int(env, local_key)
    nodes = world // local if world and local and world % local == 0 else None
    return {"world_size": world, "local_world_size": local, "num_nodes": nodes}


def _torchelastic(env: Mapping[str, str]) -> dict[str, Any]:
    return {
        "launcher": LEGACY_LAUNCH if env.get(LEGACY_FLAG_ENV) == "1" else TORCHRUN,
        **_sizes(env, "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
        **read_ints(env, rank="RANK", local_rank="LOCAL_RANK", node_rank="GROUP_RANK"),
        "max_restarts": read_int(env, "TORCHELASTIC_MAX_RESTARTS"),
        "agent_store": env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    }


def _ray(env: Mapping[str, str]) -> dict[str, Any]:
    ranks = read_ints(env, rank="RANK", local_rank="LOCAL_RANK", node_rank="NODE_RANK")
    return {**_sizes(env, "WORLD_SIZE", "LOCAL_WORLD_SIZE"), **ranks}


def _kubeflow(env: Mapping[str, str]) -> dict[str, Any]:
    world, rank = read_int(env, "WORLD_SIZE"), read_int(env, "RANK")
    # One process per pod: each pod is a node.
    return {"world_size": world, "local_world_size": 1, "num_nodes": world, "rank": rank, "local_rank": 0,
            "node_rank": rank}  # fmt: skip


def _slurm(env: Mapping[str, str]) -> dict[str, Any]:
    sizes = read_ints(env, world_size="SLURM_NTASKS", local_world_size="SLURM_NTASKS_PER_NODE")
    sizes["num_nodes"] = read_int(env, "SLURM_NNODES") or read_int(env, "SLURM_JOB_NUM_NODES")
    return sizes | read_ints(env, rank="SLURM_PROCID", local_rank="SLURM_LOCALID", node_rank="SLURM_NODEID")


def _lsf(env: Mapping[str, str]) -> dict[str, Any]:
    # jsrun says nothing of the processes per node; Lightning reads the node from LSB_DJOB_RANKFILE at run time.
    return read_ints(
        env, world_size="JSM_NAMESPACE_SIZE", rank="JSM_NAMESPACE_RANK", local_rank="JSM_NAMESPACE_LOCAL_RANK"
    )


def _mpi_names(env: Mapping[str, str]) -> tuple[str, str, str, str] | None:
    return next((names for names in _MPI_NAMES if (read_int(env, names[0]) or 0) > 1), None)


def _mpi(env: Mapping[str, str]) -> dict[str, Any]:
    size, rank, local_rank, local_size = _mpi_names(env) or _MPI_NAMES[0]
    return {**_sizes(env, size, local_size), **read_ints(env, rank=rank, local_rank=local_rank)}


def _is_slurm(env: Mapping[str, str]) -> bool:
    # Lightning's rule: a batch job has SLURM_NTASKS; an interactive shell (srun --pty bash) is not a launcher.
    return "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def _is_kubeflow(env: Mapping[str, str]) -> bool:
    # Lightning 1.x detected Kubeflow by these variables and stopped (torchrun in a pod sets them too); torchrun is
    # detected first here, and a launcher that starts processes itself sets LOCAL_RANK, which Kubeflow's pods lack.
    in_pod = any(key in env for key in _KUBERNETES_VARS)
    return in_pod and all(key in env for key in _KUBEFLOW_VARS) and "LOCAL_RANK" not in env


@dataclass(frozen=True)
class LauncherRow:
    """One launcher: how it is recognised, the layout it imposes, and how Lightning reads its ranks."""

    name: str
    detect: Callable[[Mapping[str, str]], bool]
    #: The ``LaunchEnvironment`` fields it sets (``launcher`` too, where one row stands for two names).
    read: Callable[[Mapping[str, str]], dict[str, Any]]
    #: The Lightning ``ClusterEnvironment`` (import path) that reads its ranks; ``None``: Lightning detects it itself.
    cluster_environment: str | None = None
    #: A module Lightning needs to read this launcher's ranks (checked before anything starts).
    requires: str | None = None


#: In detection order (see the module docstring).
LAUNCHERS: tuple[LauncherRow, ...] = (
    LauncherRow(TORCHRUN, lambda env: "TORCHELASTIC_RUN_ID" in env, _torchelastic),
    LauncherRow(RAY, lambda env: all(k in env for k in _RAY_WORKER_VARS), _ray,
                "ray.train.lightning.RayLightningEnvironment"),
    LauncherRow(KUBEFLOW, _is_kubeflow, _kubeflow, "lightning.pytorch.plugins.environments.KubeflowEnvironment"),
    LauncherRow(SLURM, _is_slurm, _slurm),
    LauncherRow(LSF, lambda env: all(k in env for k in _LSF_VARS), _lsf),
    LauncherRow(MPI, lambda env: _mpi_names(env) is not None, _mpi, requires="mpi4py"),
)  # fmt: skip


def detect_launcher(env: Mapping[str, str]) -> tuple[LauncherRow, dict[str, Any]] | None:
    """The first row whose launcher started this process, and the fields it reads; ``None``: no outside launcher."""
    for row in LAUNCHERS:
        if row.detect(env):
            return row, {"launcher": row.name, **row.read(env)}
    return None
