"""``parallel.micro_batch``: the sizes ``auto`` tries, what it fixes before the search, and what it refuses."""

from __future__ import annotations

import itertools
import math
from collections import namedtuple

import pytest
import torch

from project.errors import UserError
from project.extras.microbatch.plan import micro_batch_candidates, picked, take_auto
from project.extras.microbatch.search import MicroBatchSearch, micro_batch_callbacks
from project.extras.microbatch.split_step import split_batch
from project.extras.microbatch.trial import call_training_step
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig
from project.run_state import RunState

from helpers import has_layer

LOCAL = LaunchEnvironment(launcher="lightning", external=False)
TRIALS = ((64, False), (32, False), (16, True))


def state_of(gpus: int = 0, **fields) -> RunState:
    """The run's state as the builder makes it, with the layer's ``on_state`` hook applied."""
    state = RunState(ParallelConfig(**fields), Hardware(gpus))
    take_auto(state, None)
    return state


def plan(data_batch: int | None = 64, gpus: int = 0, **fields):
    return state_of(gpus, **fields).resolve(LOCAL, data_batch)


def error(**fields) -> str:
    with pytest.raises(UserError) as info:
        plan(**fields)
    return str(info.value)


@pytest.mark.parametrize("step", [1, 2, 7, 12, 64, 96, 100, 1000])
def test_candidates_divide_the_step_shrink_by_half_at_least_and_end_at_one(step):
    sizes = micro_batch_candidates(step)
    assert sizes[0] == step and sizes[-1] == 1 and all(step % size == 0 for size in sizes)
    assert all(later <= earlier // 2 for earlier, later in itertools.pairwise(sizes))
    assert len(sizes) <= math.floor(math.log2(step)) + 1  # the bound on trial steps


def test_auto_fixes_the_global_batch_and_offers_one_whole_step_per_process():
    got = plan(scenario="cpu", devices=2, global_batch_size=128, micro_batch="auto")
    assert (got.micro_batch, got.per_device_batch_size, got.accumulation, got.global_batch_size) == ("auto", 64, 1, 128)
    assert any(note.startswith("micro-batch auto: the largest of 64, 32, 16") for note in got.notes)
    # Without a global batch: the one the run would have without auto (a data batch per process).
    got = plan(data_batch=32, scenario="cpu", devices=2, micro_batch="auto")
    assert (got.per_device_batch_size, got.global_batch_size) == (32, 64)


def test_picking_keeps_the_global_batch_and_derives_the_accumulation():
    got = plan(scenario="cpu", devices=2, global_batch_size=128, micro_batch="auto")
    chosen = picked(16, TRIALS)(got)
    assert (chosen.micro_batch, chosen.per_device_batch_size, chosen.accumulation) == (16, 16, 4)
    assert "micro_batch_trials" not in got.to_dict()
    assert chosen.global_batch_size == 128 and list(map(list, chosen.to_dict()["micro_batch_trials"])) == [
        [64, False],
        [32, False],
        [16, True],
    ]
    assert chosen.notes[0].startswith("micro-batch auto picked 16 per process (64 does not, 32 does not, 16 fits)")
    assert not any(note.startswith("micro-batch auto:") for note in chosen.notes)  # the note of what was to come


def test_a_number_is_the_per_device_batch():
    got = plan(scenario="cpu", devices=2, global_batch_size=128, micro_batch=16)
    assert (got.micro_batch, got.per_device_batch_size, got.accumulation) == (16, 16, 4)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"micro_batch": "auto", "per_device_batch_size": 8}, "parallel.per_device_batch_size=8 is set too"),
        ({"micro_batch": "auto", "accumulation": 2}, "parallel.accumulation=2 is set too"),
        ({"micro_batch": 16, "per_device_batch_size": 32}, "two names of one setting"),
        ({"micro_batch": 0}, "must be a number of samples >= 1"),
        ({"micro_batch": "max"}, "must be a number of samples >= 1"),
        *(
            (({"micro_batch": "auto", "scenario": name, "devices": 2}, f"scenario '{name}' shards across processes"))
            for name in (("fsdp", "zero1") if has_layer("sharding") else ())  # the sharding layer's scenarios
        ),
        ({"micro_batch": 12, "global_batch_size": 128, "scenario": "cpu", "devices": 2}, "does not divide"),
        ({"micro_batch": "auto", "precision": "16-mixed", "gpus": 1}, "the float16 loss scaler is not applied"),
    ],
)
def test_refusals_name_the_setting(fields, needle):
    assert needle in error(**fields)


def test_the_state_keeps_auto_through_the_data_batch_and_the_pick():
    state = state_of(scenario="cpu", devices=1, global_batch_size=16, micro_batch="auto")
    assert state.section.micro_batch is None  # the core resolves one whole step per process
    state.built = state.resolve(LOCAL, None)
    assert state.plan is None and state.built.micro_batch == "auto" and state.built.splits_in_step
    completed = state.with_data_batch(16)
    assert completed.micro_batch == "auto" and completed.per_device_batch_size == 16
    chosen = state.amend(picked(4, ((16, False), (8, False), (4, True))))
    assert state.plan is chosen and chosen.micro_batch == 4 and chosen.loader_batches == completed.loader_batches
    # A later fit builds the loader again: the batch completes the built plan, and the pick is kept.
    assert state.with_data_batch(16).micro_batch == 4
    assert state.evaluating() is state.plan


def test_the_search_is_added_to_a_run_under_auto_only():
    auto = state_of(scenario="cpu", devices=1, micro_batch="auto")
    auto.built = auto.resolve(LOCAL, None)
    (search,) = micro_batch_callbacks(auto, None, None)
    assert isinstance(search, MicroBatchSearch) and search.state is auto
    fixed = state_of(scenario="cpu", devices=1, micro_batch=8)
    fixed.built = fixed.resolve(LOCAL, None)
    assert micro_batch_callbacks(fixed, None, None) == []


def test_under_auto_the_loader_hands_whole_steps_and_lightning_accumulates_nothing():
    auto = plan(scenario="cpu", devices=2, global_batch_size=128, micro_batch="auto")
    assert auto.loader_batches == (64, 1)
    chosen = picked(16, TRIALS)(auto)
    assert (chosen.per_device_batch_size, chosen.accumulation) == (16, 4)  # what each forward and backward takes
    assert chosen.loader_batches == (64, 1)  # what the sampler deals and the checkpoint's position counts
    fixed = plan(scenario="cpu", devices=2, global_batch_size=128, micro_batch=16)
    assert fixed.loader_batches == (16, 4)


def test_a_batch_splits_along_the_samples_and_keeps_its_shape():
    Pair = namedtuple("Pair", "x y")
    batch = {"x": torch.arange(8).view(4, 2), "y": Pair(torch.arange(4), ["a", "b", "c", "d"]), "vocab": torch.ones(3)}
    first, second = split_batch(batch, 4, 2)
    assert first["x"].tolist() == [[0, 1], [2, 3]] and second["y"].x.tolist() == [2, 3]
    assert second["y"].y == ["c", "d"] and isinstance(second["y"], Pair)
    assert first["vocab"] is batch["vocab"]  # not of the samples' length: whole in each
    assert [len(x) for x, _ in split_batch((torch.zeros(6, 1), torch.zeros(6)), 6, 3)] == [2, 2, 2]
    with pytest.raises(UserError, match="has nothing of that length"):
        split_batch({"x": torch.zeros(3)}, 4, 2)


def test_training_step_gets_batch_idx_only_where_it_takes_it():
    class Module:
        def with_idx(self, batch, batch_idx):
            return (batch, batch_idx)

        def without(self, batch):
            return (batch,)

    assert call_training_step(Module().with_idx, "b", 3) == ("b", 3)
    assert call_training_step(Module().without, "b", 3) == ("b",)
