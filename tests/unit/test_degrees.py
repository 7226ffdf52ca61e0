"""Degrees drive everything: a layout with a model-parallel degree (tp = 2, as a layer's degrees hook makes it),
planned on paper, makes the samplers deal over the data-parallel ranks (dp = world / 2) and the batch math count dp
ranks. No process is started: what each rank would do is computed for every rank. (The memory table and the sharded
strategy's mesh: the sharding layer's tests/extras/sharding/unit/test_sharded_degrees.py.)"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from project.callbacks.loader_guarantees import LoaderGuaranteesCallback
from project.errors import UserError
from project.parallel.samplers import GlobalBatchSampler
from project.plan.environment import LaunchEnvironment
from project.plan.layout import Layout
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan
from project.run_state import RunState

WORLD = 4
TP_2 = Layout("cpu", "cpu", WORLD, 1, dp_replicate=2, tp=2)


def paper_plan(scenario: str = "cpu", **fields):
    """A plan of 4 CPU processes whose layout says tp = 2 (what a tensor-parallel scenario resolves to)."""
    config = ParallelConfig(scenario=scenario, devices=WORLD, **fields)
    plan = resolve_plan(config, Hardware(0), LaunchEnvironment(launcher="lightning", external=False), None)
    return replace(plan, layout=replace(TP_2, scenario=plan.scenario))


def test_layout_degrees_multiply_to_the_world_size():
    layout = Layout("cpu", "cpu", WORLD, 1, dp_replicate=2, tp=2)
    assert layout.dp_size == 2 and layout.to_dict() == {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "tp": 2, "dp": 2}
    with pytest.raises(UserError, match="replicate 4 x shard 1 x tensor 2 = 8 do not match the world size 4"):
        Layout("cpu", "cpu", WORLD, 1, dp_replicate=4, tp=2)


def test_the_plan_counts_data_parallel_ranks_for_the_batch():
    plan = paper_plan().with_data_batch(8)
    assert (plan.dp_size, [plan.dp_rank(r) for r in range(WORLD)]) == (2, [0, 0, 1, 1])
    assert plan.per_device_batch_size == 8 and plan.global_batch_size == 16  # 8 x dp 2, not 8 x world 4
    with pytest.raises(UserError, match="data-parallel size 2"):
        plan = paper_plan()
        replace(plan, request=replace(plan.request, global_batch_size=15)).with_data_batch(None)


def _loader_of_rank(plan, rank: int) -> DataLoader:
    callback = LoaderGuaranteesCallback(RunState(built=plan))
    trainer = SimpleNamespace(world_size=WORLD, global_rank=rank, limit_train_batches=1.0, is_global_zero=rank == 0)
    data = TensorDataset(torch.arange(64).float())
    return callback._training(DataLoader(data, batch_size=8, shuffle=True), trainer)


def test_the_sampler_deals_over_the_data_parallel_ranks():
    plan = paper_plan()
    loaders = [_loader_of_rank(plan, rank) for rank in range(WORLD)]
    samplers = [loader.sampler for loader in loaders]
    assert all(isinstance(s, GlobalBatchSampler) for s in samplers)
    assert [(s.num_replicas, s.rank) for s in samplers] == [(2, 0), (2, 0), (2, 1), (2, 1)]
    drawn = [list(s) for s in samplers]
    assert drawn[0] == drawn[1] and drawn[2] == drawn[3] and drawn[0] != drawn[2]  # a tp group shares its data
    alone = list(GlobalBatchSampler(range(64), 16, shuffle=True, seed=samplers[0].seed))
    side_by_side = [i for k in range(4) for shard in (drawn[0], drawn[2]) for i in shard[k * 8 : (k + 1) * 8]]
    assert side_by_side == alone  # dp = 2 ranks draw one process's global batches of 16
