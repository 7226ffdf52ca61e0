"""What launched us: Lightning's own launcher, torchrun, legacy torch.distributed.launch, SLURM, Kubeflow or Ray.

Detection follows Lightning's order (TorchElastic, SLURM, else Lightning's environment) so that the
plan we print is the layout Lightning will actually use. Two launchers Lightning does not detect come
before SLURM: a Ray Train worker (which inherits SLURM's variables when the Ray cluster runs inside a
SLURM job) and a Kubeflow PyTorchJob pod; for them the plan names the Lightning ``ClusterEnvironment``
that reads their ranks (:func:`cluster_environment`), and the Trainer is given it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, get_args

from project.dotted import import_object
from project.errors import UserError
from project.plan.config import Launcher

LIGHTNING = "lightning"
TORCHRUN = "torchrun"
LEGACY_LAUNCH = "torch.distributed.launch"
SLURM = "slurm"
KUBEFLOW = "kubeflow"
RAY = "ray"
# Set by main() when it removed a legacy --local_rank argument, so that child code can tell.
LEGACY_FLAG_ENV = "PROJECT_LEGACY_LAUNCH"

_LOCAL_RANK_ARG = re.compile(r"^--local[-_]rank(?:=(.*))?$")
# What Ray Train sets in each worker (ray.train.torch's TorchConfig), beside the raylet's RAY_RAYLET_PID.
_RAY_WORKER_VARS = ("RAY_RAYLET_PID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
# What the Kubeflow training operator sets in each PyTorchJob pod (one process per pod).
_KUBEFLOW_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
# Set in every Kubernetes pod by the kubelet.
_KUBERNETES_VARS = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_PORT")
#: The Lightning cluster environments of the launchers Lightning does not detect by itself.
CLUSTER_ENVIRONMENTS = {
    RAY: "ray.train.lightning.RayLightningEnvironment",
    KUBEFLOW: "lightning.pytorch.plugins.environments.KubeflowEnvironment",
}


@dataclass(frozen=True)
class LaunchEnvironment:
    """The launcher and the layout it imposes (``None`` where the launcher leaves it to us)."""

    launcher: str
    external: bool
    world_size: int | None = None
    local_world_size: int | None = None
    num_nodes: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    # torchrun only: --max-restarts, and whether the workers share the agent's rendezvous store.
    max_restarts: int | None = None
    agent_store: bool | None = None
    # Ray and Kubeflow: the Lightning ClusterEnvironment (import path) that reads this launcher's ranks.
    cluster_environment: str | None = None
    # RAY_ADDRESS: the Ray cluster a driver (parallel.launcher: ray) submits to; None starts a local one.
    address: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for plan.json."""
        return asdict(self)


def _int(environ: Mapping[str, str], key: str) -> int | None:
    value = environ.get(key)
    if value is None or value == "":
        return None
    match = re.match(r"^\d+", value)  # SLURM writes e.g. "2(x3)"
    return int(match.group(0)) if match else None


def _is_slurm(environ: Mapping[str, str]) -> bool:
    # Lightning's rule: a batch job has SLURM_NTASKS; an interactive shell (srun --pty bash) is not a launcher.
    return "SLURM_NTASKS" in environ and environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def _is_ray_worker(environ: Mapping[str, str]) -> bool:
    return all(key in environ for key in _RAY_WORKER_VARS)


def _is_kubeflow(environ: Mapping[str, str]) -> bool:
    # Lightning 1.x detected Kubeflow by these variables and stopped (torchrun in a pod sets them too); torchrun is
    # detected first here, and a launcher that starts processes itself sets LOCAL_RANK, which Kubeflow's pods lack.
    in_pod = any(key in environ for key in _KUBERNETES_VARS)
    return in_pod and all(key in environ for key in _KUBEFLOW_VARS) and "LOCAL_RANK" not in environ


def detect_environment(environ: Mapping[str, str] | None = None) -> LaunchEnvironment:
    """Read the launcher and its layout from environment variables."""
    env = os.environ if environ is None else environ
    common = {"master_addr": env.get("MASTER_ADDR"), "master_port": _int(env, "MASTER_PORT")}
    common["address"] = env.get("RAY_ADDRESS") or None  # where parallel.launcher=ray would submit the job
    if "TORCHELASTIC_RUN_ID" in env:
        world, local_world = _int(env, "WORLD_SIZE"), _int(env, "LOCAL_WORLD_SIZE")
        nodes = world // local_world if world and local_world else None
        return LaunchEnvironment(
            launcher=LEGACY_LAUNCH if env.get(LEGACY_FLAG_ENV) == "1" else TORCHRUN,
            external=True,
            world_size=world,
            local_world_size=local_world,
            num_nodes=nodes,
            rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK"),
            node_rank=_int(env, "GROUP_RANK"),
            max_restarts=_int(env, "TORCHELASTIC_MAX_RESTARTS"),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            **common,
        )
    if _is_ray_worker(env):
        world, local_world = _int(env, "WORLD_SIZE"), _int(env, "LOCAL_WORLD_SIZE")
        return LaunchEnvironment(
            launcher=RAY,
            external=True,
            world_size=world,
            local_world_size=local_world,
            # Ray places the workers; an uneven placement has no node count (the plan then says what differs).
            num_nodes=world // local_world if world and local_world and world % local_world == 0 else None,
            rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK"),
            node_rank=_int(env, "NODE_RANK"),
            cluster_environment=CLUSTER_ENVIRONMENTS[RAY],
            **common,
        )
    if _is_kubeflow(env):
        world, rank = _int(env, "WORLD_SIZE"), _int(env, "RANK")
        return LaunchEnvironment(
            launcher=KUBEFLOW,
            external=True,
            world_size=world,
            local_world_size=1,  # one process per pod: each pod is a node
            num_nodes=world,
            rank=rank,
            local_rank=0,
            node_rank=rank,
            cluster_environment=CLUSTER_ENVIRONMENTS[KUBEFLOW],
            **common,
        )
    if _is_slurm(env):
        return LaunchEnvironment(
            launcher=SLURM,
            external=True,
            world_size=_int(env, "SLURM_NTASKS"),
            local_world_size=_int(env, "SLURM_NTASKS_PER_NODE"),
            num_nodes=_int(env, "SLURM_NNODES") or _int(env, "SLURM_JOB_NUM_NODES"),
            rank=_int(env, "SLURM_PROCID"),
            local_rank=_int(env, "SLURM_LOCALID"),
            node_rank=_int(env, "SLURM_NODEID"),
            **common,
        )
    # Lightning's launcher: the first process has no LOCAL_RANK; the ones it starts carry theirs.
    return LaunchEnvironment(
        launcher=LIGHTNING,
        external=False,
        world_size=_int(env, "WORLD_SIZE"),
        rank=_int(env, "RANK") if "RANK" in env else None,
        local_rank=_int(env, "LOCAL_RANK"),
        node_rank=_int(env, "NODE_RANK"),
        **common,
    )


def refuse_stray_rank(environment: LaunchEnvironment) -> None:
    """Refuse a ``RANK`` other than 0 that no launcher set: the process would drop every log as a non-zero rank.

    Raises:
        UserError: ``RANK`` is set in the shell, but nothing says which launcher started this process.
    """
    if environment.launcher == LIGHTNING and environment.rank not in (None, 0) and environment.local_rank is None:
        raise UserError(
            f"RANK={environment.rank} is set in the environment, but no launcher started this process (no "
            "LOCAL_RANK, TORCHELASTIC_RUN_ID or SLURM job): it would run as rank "
            f"{environment.rank} and write no logs; `unset RANK`, or start the ranks with torchrun"
        )


def requested_launcher(asked: str, environment: LaunchEnvironment) -> LaunchEnvironment:
    """The environment a plan resolves against, given ``parallel.launcher``.

    With ``auto``, or inside one of Ray's workers, that is the detected one. With ``ray`` anywhere else this
    process is the Ray driver: Ray Train starts the workers (the outside launcher, which takes the layout
    from the plan), and this process submits the job and waits. SLURM's or Kubeflow's variables then
    describe the allocation the Ray cluster runs in, not ranks of this command.

    Raises:
        UserError: an unknown launcher, or ``ray`` in a process that torchrun started (each rank would
            submit its own job).
    """
    if asked not in get_args(Launcher):
        raise UserError(f"parallel.launcher={asked!r} is not one of {', '.join(get_args(Launcher))}")
    if asked != RAY or environment.launcher == RAY:
        return environment
    if environment.launcher in (TORCHRUN, LEGACY_LAUNCH):
        raise UserError(
            f"parallel.launcher=ray in a process that {environment.launcher} started: every rank would submit its "
            "own Ray job; run `python -m project ...` once, without torchrun (Ray Train starts the workers), or "
            "drop parallel.launcher"
        )
    return LaunchEnvironment(launcher=RAY, external=True, address=environment.address)


def cluster_environment(path: str) -> Any:
    """A new instance of the Lightning ``ClusterEnvironment`` at ``path`` (one of :data:`CLUSTER_ENVIRONMENTS`)."""
    return import_object(path)()


def describe_launch(environment: LaunchEnvironment, per_node: int, num_nodes: int) -> tuple[dict[str, Any], list[str]]:
    """What this process's launch looks like (ranks on this node, master address), and notes where it will not work.

    Returns:
        The ``launch`` record for the plan, and notes for layouts that would hang or fail at start-up.
    """
    own = ("launcher", "external", "cluster_environment", "address")  # shown elsewhere in the plan
    launch = {k: v for k, v in environment.to_dict().items() if k not in own and v is not None}
    world_size = per_node * num_nodes
    if environment.launcher == RAY and environment.rank is None:  # the Ray driver: it runs no rank itself
        where = f"the Ray cluster at {environment.address}" if environment.address else "a local Ray instance"
        launch = {"workers": world_size, "address": environment.address or "local"}
        return launch, [
            f"ray: this command submits a Ray Train job of {world_size} worker(s) to {where} and waits; each "
            "worker runs the same command (no rank runs in this process)"
        ]
    if world_size == 1:
        return launch, []
    node_rank = environment.node_rank or 0
    launch["node_rank"] = node_rank
    launch["ranks_on_this_node"] = list(range(node_rank * per_node, (node_rank + 1) * per_node))
    notes: list[str] = []
    if environment.external:
        if environment.max_restarts and environment.agent_store:
            notes.append(
                "torchrun --max-restarts with the workers on the agent's rendezvous store: restarted workers can "
                "read the dead ones' addresses and fail to connect (pytorch#135712); launch torchrun with "
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and --standalone (one node) or --rdzv-backend c10d"
            )
        return launch, notes
    # Lightning's own launcher: MASTER_ADDR defaults to this machine and the port to a free one,
    # which is right on one node and a hang on several.
    launch.setdefault("master_addr", "127.0.0.1")
    settings = (
        ("MASTER_ADDR", environment.master_addr),
        ("MASTER_PORT", environment.master_port),
        ("NODE_RANK", environment.node_rank),
    )
    missing = [name for name, value in settings if value is None]
    if num_nodes > 1 and missing:
        notes.append(
            f"num_nodes={num_nodes} with Lightning's launcher: run the same command on every node with "
            f"MASTER_ADDR (node 0's address), MASTER_PORT and NODE_RANK (0..{num_nodes - 1}); "
            f"{', '.join(missing)} not set here, so the nodes would wait for each other until the timeout"
        )
    if node_rank >= num_nodes:
        notes.append(f"NODE_RANK={node_rank} is not a node of num_nodes={num_nodes}; use 0..{num_nodes - 1}")
    if environment.local_rank == 0:
        notes.append(
            "LOCAL_RANK=0 is set but no torchrun/SLURM launch was detected: Lightning would wait for "
            "processes that nobody starts; unset LOCAL_RANK (or launch with torchrun)"
        )
    return launch, notes


def strip_legacy_local_rank(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[list[str], bool]:
    """Remove ``--local-rank=N`` / ``--local_rank N`` (passed by ``torch.distributed.launch``) from ``argv``.

    Returns the cleaned arguments and whether such an argument was present. The value is checked
    against ``LOCAL_RANK``, which the launcher also sets, so a mismatch cannot go unnoticed.
    """
    env = os.environ if environ is None else environ
    cleaned: list[str] = []
    values: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        match = _LOCAL_RANK_ARG.match(args[i])
        if not match:
            cleaned.append(args[i])
            i += 1
            continue
        if match.group(1) is not None:
            values.append(match.group(1))
            i += 1
        elif i + 1 < len(args):
            values.append(args[i + 1])
            i += 2
        else:
            raise UserError(f"{args[i]} needs a value (e.g. {args[i]}=0)")
    for value in values:
        if not value.isdigit():
            raise UserError(f"--local_rank={value!r} must be a whole number >= 0")
        local_rank = env.get("LOCAL_RANK")
        if local_rank is not None and local_rank != value:
            raise UserError(
                f"--local_rank={value} disagrees with LOCAL_RANK={local_rank} set by the launcher; "
                "drop --local_rank and let the launcher set LOCAL_RANK"
            )
    return cleaned, bool(values)
