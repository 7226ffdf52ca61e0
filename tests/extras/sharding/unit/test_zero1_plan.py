"""``parallel.scenario: zero1`` on paper: the plan's rows, the strategy it builds, the memory table, the refusals.

No process is started; the real runs are in tests/extras/sharding/distributed/test_zero1.py.
"""

from __future__ import annotations

import pytest
import torch
from rich.console import Console

from project.errors import UserError
from project.extras.sharding.plan.memory import estimate
from project.extras.sharding.plan.report import memory_table
from project.extras.sharding.zero1 import ZeroOneStrategy, _constructor_defaults, shard_optimizer_state
from project.models.digits_net import DigitsNet
from project.parallel.strategies import row_of, trainer_kwargs
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

LOCAL = LaunchEnvironment(launcher="lightning", external=False)
ADAMW = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.003, "weight_decay": 0.0001}}


def plan(gpus: int, **fields):
    return resolve_plan(ParallelConfig(scenario="zero1", **fields), Hardware(gpus), LOCAL, 64)


@pytest.mark.parametrize(
    ("fields", "gpus", "expected"),
    [
        ({"devices": 2}, 0, ("cpu", 2, "zero1", "gloo")),
        ({}, 0, ("cpu", 1, "single_device", None)),
        ({"devices": "all"}, 4, ("gpu", 4, "zero1", "nccl")),
    ],
)
def test_zero1_runs_on_the_gpus_or_cpu_processes(fields, gpus, expected):
    got = plan(gpus, **fields)
    assert (got.accelerator, got.world_size, got.strategy, got.backend) == expected
    assert (got.layout.dp_replicate, got.layout.dp_shard, got.layout.tp) == (got.world_size, 1, 1)


def test_the_plan_shows_strategy_zero1_with_ddp_arguments_and_its_capabilities():
    data = plan(0, devices=2, ddp={"broadcast_buffers": False}).to_dict()
    strategy = data["strategy"]
    assert strategy["name"] == "zero1"
    assert strategy["ddp"] == {"find_unused_parameters": False, "broadcast_buffers": False}
    assert {"timeout_s", "start_method"} <= set(strategy)
    assert "ZeroRedundancyOptimizer" in strategy["optimizer_state"] and "one file" in strategy["checkpoint"]
    assert data["capabilities"] == {
        "shards_parameters": False,
        "shards_optimizer_state": True,
        "checkpoint": "file",
        "grads_are_dtensors": False,
        "stages": False,
    }


def test_the_row_builds_the_zero1_strategy_with_ddp_settings():
    built = trainer_kwargs(plan(0, devices=2, ddp={"find_unused_parameters": True}))["strategy"]
    assert isinstance(built, ZeroOneStrategy)
    assert built.process_group_backend == "gloo" and built._ddp_kwargs["find_unused_parameters"] is True
    row = row_of(built)
    assert row.shards_optimizer_state and not row.shards_parameters and row.memory == "zero1"


def test_the_memory_table_marks_zero1_planned_with_half_the_optimizer_state():
    got = plan(0, devices=2)
    memory = estimate(
        DigitsNet(),
        ADAMW,
        planned=got.row.memory,
        layout=got.layout,
        sharding="full",
        cpu_offload=False,
        precision="32",
    )
    assert memory["planned"] == "zero1"
    rows = memory["per_device"]
    assert rows["zero1"]["optimizer_state"]["bytes"] * 2 == rows["ddp"]["optimizer_state"]["bytes"]
    assert rows["zero1"]["parameters"]["bytes"] == rows["ddp"]["parameters"]["bytes"]
    console = Console(record=True, width=200)
    console.print(memory_table(memory))
    assert "zero1 / 2 (planned)" in console.export_text()


def test_adamw_is_rebuilt_from_its_defaults_less_what_its_constructor_sets_itself():
    params = [torch.nn.Parameter(torch.zeros(3))]
    adamw = torch.optim.AdamW(params, lr=0.01, weight_decay=0.5)
    defaults = _constructor_defaults(adamw)
    assert defaults["lr"] == 0.01 and defaults["weight_decay"] == 0.5
    assert torch.optim.AdamW(params, **defaults).defaults == adamw.defaults


@pytest.mark.parametrize(
    ("optimizer", "words"),
    [
        (torch.optim.LBFGS([torch.nn.Parameter(torch.zeros(3))]), ["LBFGS", "zero1", "scenario ddp"]),
        (object(), ["object is not a torch.optim.Optimizer", "zero1", "scenario ddp"]),
    ],
    ids=["lbfgs", "not-an-optimizer"],
)
def test_what_zero1_cannot_shard_is_refused_in_one_line(optimizer, words):
    with pytest.raises(UserError) as caught:
        shard_optimizer_state(optimizer)
    message = str(caught.value)
    assert "\n" not in message and all(word in message for word in words), message
