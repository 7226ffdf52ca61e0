"""The lr layer without a process: the factor and its checks, the plan's entry and note, and the callback's place.

Each test pins a number or a sentence a user reads in ``plan`` (from the mutation pass, docs/mutation-plan.md): the
factor of each rule, which setting an error names, the learning rate the optimizer gets, and which notes appear.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from project.callbacks import LoaderGuaranteesCallback
from project.errors import UserError
from project.extras.lr.callback import LearningRateCallback, learning_rate_callbacks
from project.extras.lr.config import LearningRate
from project.extras.lr.plan import take_learning_rate
from project.plan.config import MOVED_FIELDS
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig
from project.run_state import RunState

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def state_of(data_batch: int | None = 64, configured_lr: float | None = None, **fields) -> RunState:
    """A run's state after the layer's ``on_state`` hook; its plan resolved on a CPU with a data batch."""
    rate = {name: fields.pop(name) for name in ("lr_scaling", "reference_batch_size", "warmup_steps") if name in fields}
    state = RunState(ParallelConfig(scenario="cpu", learning_rate=LearningRate(**rate), **fields), Hardware(0))
    take_learning_rate(state, {"optimizer": {"init_args": {"lr": configured_lr}}})
    state.built = state.resolve(LOCAL, data_batch)
    return state


def rate_of(**fields) -> dict:
    return state_of(**fields).built.to_dict()["learning_rate"]


@pytest.mark.parametrize(
    ("fields", "factor"),
    [
        ({}, 1.0),
        ({"lr_scaling": "linear", "reference_batch_size": 64}, 4.0),
        ({"lr_scaling": "sqrt", "reference_batch_size": 64}, 2.0),
        ({"lr_scaling": "linear", "reference_batch_size": 512}, 0.5),
    ],
)
def test_learning_rate_scales_with_the_global_batch_against_the_reference(fields, factor):
    got = rate_of(devices=4, **fields)  # global batch 64 x 4 = 256
    assert got["factor"] == factor
    assert got["scaling"] == fields.get("lr_scaling", "none")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"lr_scaling": "linear"}, ["parallel.learning_rate.lr_scaling='linear'", "reference_batch_size"]),
        ({"lr_scaling": "sqrt", "reference_batch_size": 0}, ["reference_batch_size >= 1", "got 0"]),
        ({"warmup_steps": -1}, ["parallel.learning_rate.warmup_steps=-1", ">= 0"]),
    ],
)
def test_learning_rate_settings_are_checked(fields, words):
    with pytest.raises(UserError) as info:
        state_of(**fields)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_sqrt_scaling_takes_the_square_root():
    assert rate_of(data_batch=576, lr_scaling="sqrt", reference_batch_size=64)["factor"] == 3.0  # 576 / 64 = 9
    assert rate_of(data_batch=16, lr_scaling="sqrt", reference_batch_size=64)["factor"] == 0.5


def test_a_reference_batch_of_one_is_legal():
    assert rate_of(data_batch=8, lr_scaling="linear", reference_batch_size=1)["factor"] == 8.0


def test_the_plan_shows_the_configured_and_the_scaled_learning_rate():
    got = state_of(configured_lr=0.1, devices=2, lr_scaling="linear", reference_batch_size=32, warmup_steps=10).built
    assert got.to_dict()["learning_rate"] == {
        "scaling": "linear",
        "reference_batch_size": 32,
        "factor": 4.0,
        "warmup_steps": 10,
        "lr": {"configured": 0.1, "scaled": 0.4},
    }
    assert "learning rates x 4 (linear: global batch 128 against the reference 32)" in got.notes
    assert rate_of()["lr"] is None  # no configured rate: nothing to scale
    unknown = rate_of(data_batch=None, configured_lr=0.1, lr_scaling="linear", reference_batch_size=32)
    assert unknown["factor"] is None and unknown["lr"] is None  # the batch is unknown


def test_a_plan_without_scaling_says_nothing_about_learning_rates():
    got = state_of(configured_lr=0.1, devices=2).built
    assert got.to_dict()["learning_rate"]["lr"] == {"configured": 0.1, "scaled": 0.1}
    assert not [note for note in got.notes if "learning rate" in note], got.notes


def test_the_data_batch_completes_the_factor_and_the_note_once():
    state = state_of(data_batch=None, global_batch_size=None, lr_scaling="linear", reference_batch_size=8)
    assert state.built.records["learning_rate"]["factor"] is None
    completed = state.with_data_batch(16)
    assert completed.records["learning_rate"]["factor"] == 2.0
    assert [note for note in state.with_data_batch(16).notes if note.startswith("learning rates")] == [
        "learning rates x 2 (linear: global batch 16 against the reference 8)"
    ]


def test_the_flat_names_of_earlier_versions_say_the_subsection():
    assert {old: new for old, new in MOVED_FIELDS.items() if new.startswith("learning_rate.")} == {
        "lr_scaling": "learning_rate.lr_scaling",
        "reference_batch_size": "learning_rate.reference_batch_size",
        "warmup_steps": "learning_rate.warmup_steps",
    }


FIT, CHECK = SimpleNamespace(trains=True), SimpleNamespace(trains=False)


def test_the_callback_comes_for_a_fit_that_scales_or_warms_up_and_reads_the_completed_plan():
    state = state_of(data_batch=None, global_batch_size=16, lr_scaling="linear", reference_batch_size=8)
    (rate,) = learning_rate_callbacks(state, FIT, None)
    assert isinstance(rate, LearningRateCallback) and rate.state is state
    trainer = SimpleNamespace(world_size=1, global_rank=0, limit_train_batches=1.0, is_global_zero=True)
    loaders = LoaderGuaranteesCallback(state)
    loaders._training(DataLoader(TensorDataset(torch.arange(64).float()), batch_size=16), trainer)
    assert rate._settings()["factor"] == 2.0  # the learning rate reads the completed plan from the same state
    assert learning_rate_callbacks(state, CHECK, None) == []  # a self-test keeps the configured rates
    assert learning_rate_callbacks(state_of(), FIT, None) == []  # nothing to change
    assert learning_rate_callbacks(RunState(), FIT, None) == []  # parallel: null
    assert len(learning_rate_callbacks(state_of(warmup_steps=3), FIT, None)) == 1
