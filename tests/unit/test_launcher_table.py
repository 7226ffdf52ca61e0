"""The launchers' table (project/plan/launchers.py) recognises a launcher exactly where Lightning's own
ClusterEnvironment does, reads the layout each imposes, and refuses mpirun without the module Lightning needs."""

from __future__ import annotations

import importlib.util

import pytest
from lightning.fabric.plugins.environments import LSFEnvironment, SLURMEnvironment, TorchElasticEnvironment

from project.errors import UserError
from project.plan.environment import detect_environment, refuse_missing_requirement
from project.plan.launchers import LAUNCHERS

TORCHRUN = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "5", "LOCAL_RANK": "1",
            "GROUP_RANK": "1"}  # fmt: skip
SLURM = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "2", "SLURM_PROCID": "3",
         "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_JOB_NAME": "train"}  # fmt: skip
LSF = {"LSB_JOBID": "77", "LSB_DJOB_RANKFILE": "/tmp/ranks", "JSM_NAMESPACE_LOCAL_RANK": "1",
       "JSM_NAMESPACE_SIZE": "6", "JSM_NAMESPACE_RANK": "4"}  # fmt: skip
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}  # fmt: skip
MPICH = {"PMI_SIZE": "2", "PMI_RANK": "1", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
SHELL = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "bash"}  # srun --pty bash: not a launcher


@pytest.mark.parametrize(
    ("environ", "lightning_class"),
    [(TORCHRUN, TorchElasticEnvironment), (SLURM, SLURMEnvironment), (LSF, LSFEnvironment), (SHELL, SLURMEnvironment)],
)
def test_detection_agrees_with_lightning(monkeypatch, environ, lightning_class):
    """Each launcher is found where Lightning's own ClusterEnvironment.detect() finds it, and only there."""
    for key in [*TORCHRUN, *SLURM, *LSF]:
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    ours = detect_environment(environ).external
    assert ours == lightning_class.detect()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (TORCHRUN, ("torchrun", 8, 4, 2, 5, 1)),
        (SLURM, ("slurm", 4, 2, 2, 3, 1)),
        (LSF, ("lsf", 6, None, None, 4, 1)),
        (OPEN_MPI, ("mpi", 4, 2, 2, 2, 0)),
        (MPICH, ("mpi", 2, 2, 1, 1, 1)),
        ({**SLURM, **TORCHRUN}, ("torchrun", 8, 4, 2, 5, 1)),  # torchrun inside a SLURM job: torchrun's ranks
        (SHELL, ("lightning", None, None, None, None, None)),
    ],
)
def test_each_launcher_imposes_its_layout(environ, expected):
    env = detect_environment(environ)
    got = (env.launcher, env.world_size, env.local_world_size, env.num_nodes, env.rank, env.local_rank)
    assert got == expected


def test_the_table_is_in_lightnings_order_with_the_undetected_ones_before_slurm():
    names = [row.name for row in LAUNCHERS]
    assert names == ["torchrun", "ray", "kubeflow", "slurm", "lsf", "mpi"]
    assert [row.name for row in LAUNCHERS if row.cluster_environment] == ["ray", "kubeflow"]


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is not None, reason="mpi4py is installed here")
def test_mpirun_without_mpi4py_is_one_line():
    with pytest.raises(UserError, match=r"mpi started this process \(4 ranks\).*mpi4py.*pip install mpi4py"):
        refuse_missing_requirement(detect_environment(OPEN_MPI))
