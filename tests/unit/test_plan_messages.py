"""Each error and note of the plan ends with its fix, spelled as the user must type it (from the mutation pass,
docs/mutation-plan.md): a variable's name in the wrong case, or a fix cut off, would send the user the wrong way.
"""

from __future__ import annotations

import importlib.util

import pytest

from project.errors import UserError
from project.plan.environment import (
    LaunchEnvironment,
    detect_environment,
    refuse_missing_requirement,
    refuse_stray_rank,
    requested_launcher,
)
from project.plan.launch_notes import describe_launch
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(gpus: int, env: LaunchEnvironment = LOCAL, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), env, 64)


def error(call, *args, **kwargs) -> str:
    with pytest.raises(UserError) as info:
        call(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    ("gpus", "fields", "start", "end"),
    [
        (
            4,
            {"scenario": "ddp", "devices": []},
            "parallel.devices=[] is empty",
            "list at least one GPU id, or use 'all'",
        ),
        (
            0,
            {"scenario": "cpu", "devices": [0, 1]},
            "parallel.devices=[0, 1] with scenario 'cpu' on CPU must be",
            "a number of processes (e.g. 2); GPU ids and 'all' need GPUs",
        ),
        (
            0,
            {"scenario": "ddp"},
            "parallel.scenario='ddp' needs GPUs",
            "use scenario 'cpu' (devices N runs N processes), or plan with --assume_gpus N",
        ),
        (
            0,
            {"scenario": "cpu", "precision": "16-mixed"},
            "parallel.precision='16-mixed' needs GPUs",
            "on CPU use 'bf16-mixed' (CPU autocast) or '32'",
        ),
        (
            0,
            {"scenario": "cpu", "devices": 2, "sync_batchnorm": True},
            "parallel.sync_batchnorm=true needs GPUs (SyncBatchNorm does not run on CPU); ",
            "set it false, or use a GPU scenario",
        ),
        (
            0,
            {"scenario": "cpu", "devices": 2, "backend": "nccl"},
            "parallel.backend='nccl' needs GPUs;",
            "use 'gloo' (or 'auto') for CPU processes",
        ),
    ],
)
def test_a_refused_config_ends_with_its_fix(gpus, fields, start, end):
    message = error(plan, gpus, **fields)
    assert message.startswith(start) and message.endswith(end), message


def test_a_stray_rank_says_what_is_missing_and_the_fix():
    message = error(refuse_stray_rank, detect_environment({"RANK": "3"}))
    assert "(no LOCAL_RANK, TORCHELASTIC_RUN_ID or SLURM job): it would run as rank 3" in message, message
    assert message.endswith("`unset RANK`, or start the ranks with torchrun"), message


def test_launcher_ray_under_torchrun_says_to_run_once():
    torchrun = detect_environment({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    message = error(requested_launcher, "ray", torchrun)
    assert "every rank would submit its own Ray job; run `python -m project ...` once, without torchrun" in message
    assert message.endswith("(Ray Train starts the workers), or drop parallel.launcher"), message


def test_mpirun_without_mpi4py_says_how_else_to_start_the_ranks(monkeypatch):
    environ = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}
    environment = detect_environment(environ)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a))
    message = error(refuse_missing_requirement, environment)
    assert message.endswith("`pip install mpi4py`, or start the ranks with torchrun"), message


def test_the_notes_end_with_what_to_do():
    restarts = LaunchEnvironment(
        launcher="torchrun", external=True, world_size=2, local_world_size=2, max_restarts=3, agent_store=True
    )
    (note,) = describe_launch(restarts, 2, 1)[1]
    assert note.startswith(
        "torchrun --max-restarts with the workers on the agent's rendezvous store: restarted "
        "workers can read the dead ones' addresses and fail to connect (pytorch#135712)"
    )
    assert note.endswith("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and --standalone (one node) or --rdzv-backend c10d")
    stray = LaunchEnvironment(launcher="lightning", external=False, local_rank=0)
    assert describe_launch(stray, 2, 1)[1][-1].endswith("unset LOCAL_RANK (or launch with torchrun)")
    ray = plan(0, scenario="cpu", devices=2, launcher="ray").notes[-1]
    assert ray.endswith("each worker runs the same command (no rank runs in this process)"), ray


def test_the_setting_notes_say_the_consequence():
    notes = plan(0, scenario="cpu", devices=2, ddp={"broadcast_buffers": False}).notes
    said = "ddp.broadcast_buffers=false: each rank keeps its own buffers (BatchNorm statistics, any module's); "
    assert any(note.startswith(said) for note in notes)
    # compile: true is the compile layer's: it takes it off the section first; what reaches the core is refused
    with pytest.raises(UserError, match=r"^parallel.compile=true needs the compile layer \(project/extras/compile\)"):
        plan(0, compile=True)
