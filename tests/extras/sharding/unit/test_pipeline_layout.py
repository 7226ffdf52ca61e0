"""``parallel.pipeline_parallel`` in the plan: where its stages sit in the layout, and every impossible layout in
one line (issue 35)."""

from __future__ import annotations

import pytest

from project.errors import UserError
from project.extras.sharding.plan.config import PipelineParallel, TensorParallel
from project.plan.environment import LaunchEnvironment
from project.plan.layout import Layout
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(gpus: int = 0, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), LOCAL, 8)


def test_the_pipeline_is_the_outermost_degree():
    got = plan(8, scenario="ddp", pipeline_parallel=PipelineParallel(size=2))
    assert got.strategy == "pipeline" and got.to_dict()["degrees"] == {
        "pp": 2,
        "dp_replicate": 4,
        "dp_shard": 1,
        "tp": 1,
        "dp": 4,
    }
    layout = got.layout
    assert layout.group_ranks(("pp",)) == [[0, 4], [1, 5], [2, 6], [3, 7]]  # each pipeline: one rank per stage
    assert layout.group_ranks(("dp_replicate", "dp_shard")) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a stage's replicas
    assert layout.mesh_shape() == ((2, 4), ("pp", "dp_replicate"))
    assert got.global_batch_size == 32 and got.strategy_args["microbatches"] == 2
    gpipe = plan(0, scenario="cpu", devices=4, pipeline_parallel=PipelineParallel(size=2, schedule="gpipe"))
    assert (gpipe.layout.pp, gpipe.layout.dp_replicate, gpipe.strategy_args["schedule"]) == (2, 2, "gpipe")
    assert gpipe.row.stages and gpipe.to_dict()["capabilities"]["stages"] is True


def test_a_layout_whose_degrees_do_not_multiply_is_refused():
    with pytest.raises(UserError, match=r"pipeline 2 x replicate 2 x shard 1 x tensor 1 = 4 do not match the world"):
        Layout("cpu", "cpu", 2, 1, dp_replicate=2, pp=2)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"devices": 3, "pipeline_parallel": PipelineParallel(size=2)}, "does not divide the world size 3"),
        ({"devices": 2, "pipeline_parallel": PipelineParallel(size=0)}, "pipeline_parallel.size=0 must be >= 1"),
        ({"scenario": "zero1", "devices": 2, "pipeline_parallel": PipelineParallel(size=2)}, "pipeline parallelism"),
        (
            {"devices": 4, "pipeline_parallel": PipelineParallel(size=2), "tensor_parallel": TensorParallel(size=2)},
            "pipeline and tensor parallelism do not run together",
        ),
        (
            {"devices": 4, "pipeline_parallel": PipelineParallel(size=4, microbatches=2)},
            "microbatches=2 is fewer than the 4 stages",
        ),
        (
            {"scenario": "fsdp", "devices": 4, "pipeline_parallel": PipelineParallel(size=2)},
            "pipeline parallelism runs with scenario 'cpu', 'ddp'",
        ),
    ],
)
def test_an_impossible_pipeline_is_one_line(fields, words):
    with pytest.raises(UserError) as info:
        plan(0, **{"scenario": "cpu", **fields})
    message = str(info.value)
    assert words in message and "\n" not in message, message
