"""The compile layer without a process: compiling in place, and the plan's field and note through the run state."""

from __future__ import annotations

import copy

import pytest
from torch import nn

from project.errors import UserError
from project.extras.compile.compile import (
    NOTE,
    CompileAfterWrap,
    compile_after_wrap,
    compile_callbacks,
    is_compiled,
    take_compile,
)
from project.models.classifier import Classifier
from project.models.digits_net import DigitsNet
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig
from project.run_state import RunState

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def state_of(**fields) -> RunState:
    """A run's state after the layer's ``on_state`` hook, its plan resolved with a data batch of 64."""
    state = RunState(ParallelConfig(**fields), Hardware(0))
    take_compile(state, None)
    state.built = state.resolve(LOCAL, 64)
    return state


def test_the_plan_says_compile_with_its_note_and_the_callback_follows():
    state = state_of(precision="bf16-mixed", compile=True)
    data = state.built.to_dict()
    assert data["compile"] is True and data["precision"] == "bf16-mixed"
    assert NOTE in state.built.notes and "CPU autocast to bfloat16" in " ".join(state.built.notes)
    assert [type(c) for c in compile_callbacks(state, None, None)] == [CompileAfterWrap]
    plain = state_of()
    assert "compile" not in plain.built.to_dict() and compile_callbacks(plain, None, None) == []


def test_the_compile_note_stays_beside_the_fsdp_notes():
    pytest.importorskip("project.extras.sharding")
    notes = state_of(scenario="fsdp", devices=2, compile=True).built.notes
    assert NOTE in notes and any(note.startswith("fsdp full:") for note in notes), notes


def test_compile_after_wrap_compiles_the_networks_in_place_and_keeps_plain_keys():
    module = Classifier(DigitsNet(hidden=16))
    keys = list(module.state_dict())
    assert compile_after_wrap(module) == ["net"]  # loss_fn and the metrics hold no parameters
    assert is_compiled(module.net) and not is_compiled(module) and not is_compiled(module.loss_fn)
    assert list(module.state_dict()) == keys and not any("_orig_mod" in key for key in keys)
    compiled = module.net._compiled_call_impl
    compile_after_wrap(module)  # a strategy and the callback may both call it: compiled once
    assert module.net._compiled_call_impl is compiled
    assert not is_compiled(copy.deepcopy(module.net))  # what the export of the best checkpoint copies
    with pytest.raises(UserError, match=r"parallel.compile=true found no network in Linear"):
        compile_after_wrap(nn.Linear(2, 2))
