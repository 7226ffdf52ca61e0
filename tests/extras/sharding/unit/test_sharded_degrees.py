"""A layout with tensor parallelism (tp = 2), planned on paper, makes the memory table divide by the data-parallel
degree (dp = world / 2) and the sharded strategy's mesh take (dp, tp); the samplers and the batch math are the core's
(tests/unit/test_degrees.py)."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from project.extras.sharding.fsdp.strategy import build as build_fsdp
from project.extras.sharding.plan.memory import estimate
from project.plan.environment import LaunchEnvironment
from project.plan.layout import Layout
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

WORLD = 4
TP_2 = Layout("cpu", "cpu", WORLD, 1, dp_replicate=2, tp=2)


def paper_plan(scenario: str = "cpu", **fields):
    """A plan of 4 CPU processes whose layout says tp = 2 (what a tensor-parallel scenario resolves to)."""
    config = ParallelConfig(scenario=scenario, devices=WORLD, **fields)
    plan = resolve_plan(config, Hardware(0), LaunchEnvironment(launcher="lightning", external=False), None)
    return replace(plan, layout=replace(TP_2, scenario=plan.scenario))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)


def test_memory_divides_by_the_data_parallel_degree():
    section = {"class_path": "torch.optim.Adam"}
    memory = estimate(Net(), section, planned="ddp", layout=TP_2, sharding="full", cpu_offload=False, precision="32")
    rows = memory["per_device"]
    assert rows["zero1"]["shard_degree"] == 2 and rows["fsdp"]["shard_degree"] == 2
    full = rows["ddp"]["optimizer_state"]["bytes"]
    assert rows["zero1"]["optimizer_state"]["bytes"] == full // 2
    assert rows["zero1"]["parameters"] == rows["ddp"]["parameters"]


def test_the_sharded_strategy_mesh_takes_the_layout_degrees():
    plan = paper_plan(scenario="fsdp")
    strategy = build_fsdp(plan.strategy_args, plan.backend, plan.layout)
    assert strategy.layout is plan.layout and (plan.layout.dp_size, plan.layout.tp) == (2, 2)
    # Lightning's mesh gets them through ModelParallelStrategy's own constructor (nothing set on it afterwards).
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (2, 2)
