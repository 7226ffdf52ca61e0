"""The batch rules of the plan at their edges (from the mutation pass, docs/mutation-plan.md).

Each test pins a number or a sentence a user reads in ``plan``: the smallest legal sizes, which setting an error
names, and which notes appear (the learning rate's: tests/extras/lr).
"""

from __future__ import annotations

import pytest

from project.errors import UserError
from project.plan.batch import resolve_batch
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(gpus: int, data_batch: int | None = 64, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), LOCAL, data_batch)


def error(gpus: int, data_batch: int | None = 64, **fields) -> str:
    with pytest.raises(UserError) as info:
        plan(gpus, data_batch, **fields)
    return str(info.value)


def test_one_sample_and_one_micro_batch_are_legal_sizes():
    got = plan(0, data_batch=1, scenario="cpu", devices=4)
    assert (got.per_device_batch_size, got.global_batch_size, got.accumulation) == (1, 4, 1)
    got = plan(0, scenario="cpu", devices=2, per_device_batch_size=1, accumulation=1)
    assert (got.per_device_batch_size, got.global_batch_size, got.accumulation) == (1, 2, 1)
    got = plan(0, scenario="cpu", global_batch_size=1)
    assert (got.per_device_batch_size, got.global_batch_size) == (1, 1)


def test_an_integer_micro_batch_is_the_per_device_batch_and_auto_is_a_layers():
    got = plan(0, scenario="cpu", devices=2, global_batch_size=128, micro_batch=16)
    assert (got.micro_batch, got.per_device_batch_size, got.accumulation) == (16, 16, 4)
    # The microbatch layer takes `auto` off the section before the plan is resolved; here nothing did.
    assert error(0, micro_batch="auto") == (
        "parallel.micro_batch=auto needs the microbatch layer (project/extras/microbatch), which this checkout does "
        "not have; give an integer"
    )
    assert "parallel.micro_batch=16 and parallel.per_device_batch_size=8 are two names" in error(
        0, micro_batch=16, per_device_batch_size=8
    )


def test_under_dp_the_error_blames_the_data_batch_the_user_gave():
    """dp reads the loader's batch as the global one: the message names that, not a setting left unset."""
    message = error(4, data_batch=10, scenario="dp", devices="all")
    assert message.startswith("data batch_size (global under dp)=10 does not divide by the world size 4;"), message
    assert "use 8 or 12" in message
    message = error(4, data_batch=64, scenario="dp", devices="all", global_batch_size=10)
    assert message.startswith("parallel.global_batch_size=10 does not divide by the world size 4;"), message


def test_a_global_batch_below_the_world_size_suggests_only_positive_sizes():
    message = error(0, scenario="cpu", devices=4, global_batch_size=3)
    assert message.endswith("does not divide by the world size 4; use 4, or change devices"), message


def test_the_divisor_in_the_error_says_accumulation_only_when_there_is_some():
    message = error(0, scenario="cpu", devices=4, global_batch_size=10)
    assert "does not divide by the world size 4; use 8 or 12" in message, message
    message = error(0, scenario="cpu", devices=4, global_batch_size=20, accumulation=2)
    assert "does not divide by the world size 4 x accumulation 2; use 16 or 24" in message, message
    message = error(0, scenario="cpu", devices=2, global_batch_size=9, per_device_batch_size=2)
    assert message.startswith("parallel.global_batch_size=9 does not divide by per_device_batch_size 2 x world")


def test_three_sizes_that_disagree_show_their_product():
    message = error(0, scenario="cpu", devices=4, global_batch_size=20, per_device_batch_size=2, accumulation=3)
    assert "per_device_batch_size 2 x world size 4 x accumulation 3 (= 24)" in message, message


def test_a_size_below_one_is_named():
    assert "parallel.per_device_batch_size=0 must be >= 1" in error(0, scenario="cpu", per_device_batch_size=0)


def test_the_dp_note_is_for_dp_only_and_says_the_split():
    dp = plan(4, scenario="dp", devices="all")
    assert any("the global batch 64 is split into 16 per GPU" in note for note in dp.notes), dp.notes
    assert any(note.startswith("dp runs as DDP (Lightning removed DataParallel)") for note in dp.notes)
    ddp = plan(4, scenario="ddp", devices="all")
    assert not [note for note in ddp.notes if "DataParallel" in note], ddp.notes


def test_the_accumulation_note_appears_from_two_micro_batches():
    assert not [note for note in plan(0, scenario="cpu", devices=2).notes if "accumulation" in note]
    got = plan(0, scenario="cpu", devices=2, accumulation=2)
    assert any(note.startswith("gradient accumulation: 2 micro-batches of 64 per process") for note in got.notes)


def test_under_tensor_parallelism_messages_say_data_parallel_size():
    from project.plan.batch import BatchRequest, batch_fields
    from project.plan.layout import Layout

    with pytest.raises(UserError) as info:
        batch_fields(Layout("ddp", "gpu", 4, 1, dp_replicate=2, tp=2), BatchRequest(global_batch_size=5), 8)
    assert "does not divide by the data-parallel size 2" in str(info.value), str(info.value)
    with pytest.raises(UserError) as info:
        batch_fields(Layout("ddp", "gpu", 2, 1, dp_replicate=2), BatchRequest(global_batch_size=5), 8)
    assert "does not divide by the world size 2" in str(info.value), str(info.value)


def test_the_default_size_name_is_world_size():
    with pytest.raises(UserError) as info:
        resolve_batch(False, 10, 8, 4)
    assert "by the world size 4" in str(info.value)


def test_a_plan_completed_by_the_loader_gets_the_batch_and_keeps_its_notes():
    """The ranks resolve the plan before the loader exists and complete it with the loader's batch size."""
    fields = {"scenario": "dp", "devices": "all", "ddp": {"broadcast_buffers": False}, "accumulation": 2}
    early = plan(4, data_batch=None, **fields)
    assert (early.per_device_batch_size, early.global_batch_size) == (None, None)
    late = early.with_data_batch(64)
    assert (late.per_device_batch_size, late.global_batch_size, late.accumulation) == (8, 64, 2)
    assert late.notes == plan(4, **fields).notes
    assert any("ddp.broadcast_buffers=false" in note for note in late.notes)
    assert late.to_dict()["notes"] == list(late.notes)
