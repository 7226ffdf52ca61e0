"""The plan's messages about the layer's scenarios end with their fix, spelled as the user must type it (from
tests/unit/test_plan_messages.py and test_micro_batch_rules.py).
"""

from __future__ import annotations

import pytest

from project.errors import UserError
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(gpus: int, env: LaunchEnvironment = LOCAL, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), env, 64)


def error(call, *args, **kwargs) -> str:
    with pytest.raises(UserError) as info:
        call(*args, **kwargs)
    return str(info.value)


def test_fsdp_in_a_notebook_points_to_fork(monkeypatch):
    monkeypatch.setattr("sys.ps1", ">>> ", raising=False)
    message = error(plan, 0, scenario="fsdp", devices=2)
    assert message.endswith("cannot; run it from a terminal, or use scenario fork (DDP) here"), message


def test_the_fsdp_notes_say_the_consequence():
    one = plan(0, scenario="fsdp", devices=1).notes[-1]
    assert one.endswith(
        "(sharding, cpu_offload and wrap_modules apply from 2 processes); it resumes sharded checkpoints"
    ), one
    hybrid = plan(0, scenario="fsdp", devices=2, num_nodes=2, fsdp={"sharding": "hybrid"}).notes
    assert any(
        note.startswith("fsdp hybrid: parameters, gradients and optimizer state sharded within each node")
        for note in hybrid
    ), hybrid


def test_an_optimizer_that_is_not_there_is_said_so():
    from torch import nn

    from project.extras.sharding.plan.optimizer_count import count_optimizer

    source = count_optimizer(nn.Linear(2, 2), None).source
    assert source.endswith("(no optimizer in the config or configure_optimizers())"), source
