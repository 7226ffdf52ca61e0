"""The run's state (project/run_state.py): one object holds the plan as the run learns more, for every callback.

The plan is resolved before anything is built; the training loader's batch size completes it; a layer may change
every plan the run makes (the microbatch layer: ``auto``, then its pick); each replacement goes through the state,
and the callbacks the builder hands it to (the loader guarantees, the run record) see the same plan and the same
guarantees, with no callback reading another.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from project.callbacks import LoaderGuaranteesCallback, template_callbacks
from project.callbacks.run_record import RunRecordCallback
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan
from project.run_state import RunState

ONE_PROCESS = LaunchEnvironment(launcher="lightning", external=False)


def state_of(**fields) -> RunState:
    """The state the builder makes for a one-process CPU run of the ``parallel`` section ``fields``."""
    section = ParallelConfig(scenario="cpu", devices=1, **fields)
    return RunState(section, Hardware(0), resolve_plan(section, Hardware(0), ONE_PROCESS, None))


def noted(note: str):
    """A layer's change that adds ``note`` to a plan."""
    return lambda plan: replace(plan, notes=(*plan.notes, note))


def test_the_plan_is_replaced_in_order_built_data_batch_and_a_layers_changes():
    state = RunState(ParallelConfig(scenario="cpu", devices=1, global_batch_size=16), Hardware(0))
    assert state.amend(noted("before")) is None  # nothing known yet: the change waits for the plans to come
    state.built = state.resolve(ONE_PROCESS, None)
    assert state.plan is None and state.built.notes[-1] == "before"
    completed = state.with_data_batch(16)
    assert state.plan is completed and completed.per_device_batch_size == 16 and completed.notes[-1] == "before"
    changed = state.amend(noted("picked"))
    assert state.plan is changed and changed.notes[-2:] == ("before", "picked")
    # A later fit builds the loader again: the batch completes the built plan, and every change is kept, in order.
    assert state.with_data_batch(16).notes[-2:] == ("before", "picked")
    assert state.evaluating() is state.plan  # a later stage keeps what training learned


def test_an_evaluation_only_run_uses_the_built_plan():
    state = state_of(global_batch_size=8)
    assert state.evaluating() is state.built and state.plan is state.built


def test_a_state_without_a_section_resolves_nothing():
    with pytest.raises(AssertionError, match="plans nothing"):
        RunState().resolve(ONE_PROCESS, None)


def test_the_callbacks_share_the_builders_state(tmp_path):
    """The loader callback completes the plan and records its guarantee; the record writes that same plan."""
    state = state_of(global_batch_size=16)
    loaders = LoaderGuaranteesCallback(state)
    own = template_callbacks(state, loaders, None, False)
    shared = [c for c in own if isinstance(c, RunRecordCallback)]
    assert len(shared) == 1 and all(c.state is state for c in shared)
    trainer = SimpleNamespace(world_size=1, global_rank=0, limit_train_batches=1.0, is_global_zero=True)
    loaders._training(DataLoader(TensorDataset(torch.arange(64).float()), batch_size=16), trainer)
    assert state.plan is not None and state.plan.global_batch_size == 16
    assert state.guarantees["training"]["held"] is True
    record = next(c for c in own if isinstance(c, RunRecordCallback))
    strategy = SimpleNamespace()
    record.write(
        SimpleNamespace(world_size=1, num_nodes=1, num_devices=1, strategy=strategy, accelerator=None, callbacks=own),
        str(tmp_path),
    )
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["global_batch_size"] == 16 and written["guarantees"]["training"]["held"] is True
