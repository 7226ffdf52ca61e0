"""The run's state (project/run_state.py): one object holds the plan as the run learns more, for every callback.

The plan is resolved before anything is built; the training loader's batch size completes it; ``micro_batch: auto``
picks its micro-batch; each replacement goes through the state, and the callbacks the builder hands it to (the
loader guarantees, the run record) see the same plan and the same guarantees, with no callback reading another.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from project.callbacks import LoaderGuaranteesCallback, template_callbacks
from project.callbacks.learning_rate import LearningRateCallback
from project.callbacks.micro_batch import MicroBatchSearch
from project.callbacks.run_record import RunRecordCallback
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan
from project.run_state import RunState

ONE_PROCESS = LaunchEnvironment(launcher="lightning", external=False)


def state_of(**fields) -> RunState:
    """The state the builder makes for a one-process CPU run of the ``parallel`` section ``fields``."""
    section = ParallelConfig(scenario="cpu", devices=1, **fields)
    return RunState(section, Hardware(0), resolve_plan(section, Hardware(0), ONE_PROCESS, None))


def test_the_plan_is_replaced_in_order_built_data_batch_micro_batch():
    state = state_of(global_batch_size=16, micro_batch="auto")
    assert state.plan is None and state.built is not None and state.built.micro_batch == "auto"
    completed = state.with_data_batch(16)
    assert state.plan is completed and completed.per_device_batch_size == 16
    picked = state.use_micro_batch(4, ((16, False), (8, False), (4, True)))
    assert state.plan is picked and picked.micro_batch == 4 and picked.loader_batches == completed.loader_batches
    # A later fit builds the loader again: the batch completes the built plan, and the pick is kept.
    assert state.with_data_batch(16).micro_batch == 4
    assert state.evaluating() is state.plan  # a later stage keeps what training learned


def test_an_evaluation_only_run_uses_the_built_plan():
    state = state_of(global_batch_size=8)
    assert state.evaluating() is state.built and state.plan is state.built


def test_the_micro_batch_is_picked_after_the_data_batch_only():
    with pytest.raises(AssertionError, match="after the training loader completed the plan"):
        state_of(micro_batch="auto").use_micro_batch(4, ())


def test_the_callbacks_share_the_builders_state(tmp_path):
    """The loader callback completes the plan and records its guarantee; the record writes that same plan."""
    state = state_of(global_batch_size=16, micro_batch="auto", lr_scaling="linear", reference_batch_size=8)
    loaders = LoaderGuaranteesCallback(state)
    own = template_callbacks(state, loaders, None, False, learning_rate=True)
    shared = [c for c in own if isinstance(c, (MicroBatchSearch, LearningRateCallback, RunRecordCallback))]
    assert len(shared) == 3 and all(c.state is state for c in shared)
    trainer = SimpleNamespace(world_size=1, global_rank=0, limit_train_batches=1.0, is_global_zero=True)
    loaders._training(DataLoader(TensorDataset(torch.arange(64).float()), batch_size=16), trainer)
    assert state.plan is not None and state.plan.global_batch_size == 16
    rate = next(c for c in own if isinstance(c, LearningRateCallback))
    assert rate._settings()["factor"] == 2.0  # the learning rate reads the completed plan from the same state
    assert state.guarantees["training"]["held"] is True
    record = next(c for c in own if isinstance(c, RunRecordCallback))
    strategy = SimpleNamespace()
    record.write(
        SimpleNamespace(world_size=1, num_nodes=1, num_devices=1, strategy=strategy, accelerator=None, callbacks=own),
        str(tmp_path),
    )
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["global_batch_size"] == 16 and written["guarantees"]["training"]["held"] is True
