"""Messages that suggest batch values count the data-parallel ranks, never the world size (issue 35).

Under tensor parallelism (and a pipeline) several processes share one slice of each global batch: the suggestion
``model_checks`` makes for a manual-optimization module and the one ``resume_position`` makes on a resume with
another global batch must use the plan's data-parallel size, or they suggest a value that does not divide.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from project.callbacks.model_checks import refuse_manual_accumulation
from project.callbacks.resume_position import check_resumable
from project.errors import UserError
from project.extras.sharding.plan.config import PipelineParallel, TensorParallel
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


class ManualSteps(L.LightningModule):
    """A user's module that steps its optimizer itself (a GAN's shape, cut to one network)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = self.net(batch[0]).pow(2).mean()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def two_d(**fields):
    """4 CPU processes as fsdp x tensor parallel 2: data-parallel size 2, world size 4."""
    config = ParallelConfig(scenario="fsdp", devices=4, tensor_parallel=TensorParallel(size=2), **fields)
    return config, resolve_plan(config, Hardware(0), LOCAL, None).with_data_batch(4)


def test_manual_optimization_suggests_the_global_batch_of_one_data_parallel_step():
    config, plan = two_d(global_batch_size=32, per_device_batch_size=4)
    assert (plan.layout.dp_size, plan.world_size, plan.accumulation) == (2, 4, 4)
    with pytest.raises(UserError) as info:
        refuse_manual_accumulation(ManualSteps(), plan.accumulation, config, plan)
    message = str(info.value)
    # 4 per device x 2 data-parallel ranks: 8 (the world size would say 16, which 4 x 2 x 1 never makes)
    assert "x data-parallel size 2 x accumulation 4" in message, message
    assert "set parallel.global_batch_size: 8 " in message, message


def test_a_resume_with_another_global_batch_names_the_data_parallel_size():
    _, plan = two_d(per_device_batch_size=4)
    assert plan.global_batch_size == 8
    with pytest.raises(UserError) as info:
        check_resumable({"global_batch_size": 16, "accumulation": 1}, plan)
    message = str(info.value)
    assert "this run's would be 8 (4 per process x data-parallel size 2)" in message, message
    assert "--parallel.global_batch_size 16" in message, message


def test_a_pipeline_counts_its_stages_once():
    config = ParallelConfig(scenario="cpu", devices=4, pipeline_parallel=PipelineParallel(size=2))
    plan = resolve_plan(config, Hardware(0), LOCAL, None).with_data_batch(4)
    assert (plan.layout.dp_size, plan.global_batch_size) == (2, 8)
    assert [plan.dp_rank(rank) for rank in range(4)] == [0, 1, 0, 1]
    assert [plan.layout.pp_rank(rank) for rank in range(4)] == [0, 0, 1, 1]
    with pytest.raises(UserError) as info:
        check_resumable({"global_batch_size": 4, "accumulation": 1}, plan)
    assert "(4 per process x data-parallel size 2)" in str(info.value), str(info.value)
