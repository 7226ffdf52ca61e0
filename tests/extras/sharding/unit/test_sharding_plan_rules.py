"""The layer's rules of the plan: fsdp's degrees and notes, its settings on other scenarios, the arguments of the
fsdp and zero1 strategies, the flat names that moved into ``parallel.fsdp`` (from tests/unit/test_plan_layout_rules.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields

import pytest

from project.errors import UserError
from project.extras.sharding.plan.strategy_args import DEFAULT_WRAP_RULE
from project.plan.config import MOVED_FIELDS
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(gpus: int, env: LaunchEnvironment = LOCAL, data_batch: int | None = 64, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), env, data_batch)


def error(gpus: int, env: LaunchEnvironment = LOCAL, kind: type[Exception] = UserError, **fields) -> str:
    with pytest.raises(kind) as info:
        plan(gpus, env, **fields)
    return str(info.value)


# --- fsdp degrees ------------------------------------------------------------------------------------------------


def test_fsdp_full_shards_over_every_process_and_hybrid_within_a_node():
    full = plan(0, scenario="fsdp", devices=2, num_nodes=2)
    assert json.dumps(full.layout.to_dict()) == '{"pp": 1, "dp_replicate": 1, "dp_shard": 4, "tp": 1, "dp": 4}'
    assert full.accelerator == "cpu" and full.world_size == 4
    assert any(
        note.startswith("fsdp full: parameters, gradients and optimizer state sharded over all 4 processes")
        for note in full.notes
    )
    hybrid = plan(0, scenario="fsdp", devices=2, num_nodes=2, fsdp={"sharding": "hybrid"})
    assert json.dumps(hybrid.layout.to_dict()) == '{"pp": 1, "dp_replicate": 2, "dp_shard": 2, "tp": 1, "dp": 4}'
    assert any("sharded within each node (2 processes), replicated across 2 nodes" in note for note in hybrid.notes)


def test_hybrid_on_one_node_is_refused_with_the_node_count():
    message = error(0, scenario="fsdp", devices=2, fsdp={"sharding": "hybrid"})
    assert message.startswith("parallel.fsdp.sharding='hybrid' shards within a node") and "num_nodes=1;" in message


def test_grad_op_keeps_the_parameters_gathered_and_says_so():
    got = plan(0, scenario="fsdp", devices=2, fsdp={"sharding": "grad_op"})
    assert got.strategy_args["reshard_after_forward"] is False
    assert any(
        note.startswith("fsdp grad_op: gradients and optimizer state (parameters stay gathered") for note in got.notes
    )


def test_fsdp_settings_belong_to_fsdp():
    message = error(0, scenario="cpu", devices=2, fsdp={"sharding": "grad_op"})
    assert message.startswith(
        "parallel.fsdp.sharding='grad_op' applies to scenario fsdp only, and this plan's scenario is 'cpu'"
    )
    offload = error(0, scenario="cpu", fsdp={"cpu_offload": True})
    assert "parallel.fsdp.cpu_offload=True applies to scenario fsdp only" in offload


def test_ddp_settings_are_refused_where_the_model_is_sharded():
    message = error(0, scenario="fsdp", devices=2, backend="gloo", ddp={"broadcast_buffers": False})
    assert message.startswith("parallel.ddp.broadcast_buffers=False applies to DDP, and scenario 'fsdp'"), message
    unused = error(0, scenario="fsdp", devices=2, backend="gloo", ddp={"find_unused_parameters": True})
    assert "drop parallel.ddp.find_unused_parameters" in unused


def test_a_choice_of_a_subsection_built_in_code_is_checked_with_its_full_name():
    """The parser checks a ``Literal`` choice; a config built in code gets the same one line, subsections included."""
    sharding = error(0, scenario="fsdp", devices=2, fsdp={"sharding": "zero3"})
    assert sharding == "parallel.fsdp.sharding='zero3' is not one of full, grad_op, hybrid"
    schedule = error(0, scenario="cpu", devices=2, pipeline_parallel={"schedule": "interleaved"})
    assert schedule == "parallel.pipeline_parallel.schedule='interleaved' is not one of 1f1b, gpipe"


def test_the_flat_names_of_earlier_versions_map_to_the_fsdp_subsection():
    assert {old: new for old, new in MOVED_FIELDS.items() if new.startswith("fsdp.")} == {
        "sharding": "fsdp.sharding",
        "cpu_offload": "fsdp.cpu_offload",
        "wrap_modules": "fsdp.wrap_modules",
        "async_save": "fsdp.async_save",
    }
    names = [f.name for f in fields(ParallelConfig)]  # the layer's subsections after the core's fields and ddp
    assert names[-3:] == ["fsdp", "tensor_parallel", "pipeline_parallel"] and names.index("ddp") < names.index("fsdp")


def test_fsdp_on_one_process_and_on_cpu_processes_says_what_it_does():
    one = plan(0, scenario="fsdp", devices=1)
    assert one.strategy == "single_device" and one.notes[-1].startswith("fsdp on one process: nothing to shard")
    cpu = plan(0, scenario="fsdp", devices=2, fsdp={"cpu_offload": True})
    assert "fsdp on CPU processes over gloo (no GPU visible): the same FSDP2 code as on GPUs" in cpu.notes
    assert any(note.startswith("cpu_offload on CPU processes changes nothing") for note in cpu.notes)
    gpu = plan(4, scenario="fsdp", devices="all", fsdp={"cpu_offload": True})
    assert not [note for note in gpu.notes if "CPU processes" in note], gpu.notes


def test_the_fsdp_arguments_the_plan_shows():
    # The parallel.fsdp subsection as given, beside what the plan derives from it.
    fsdp = {"sharding": "full", "cpu_offload": False, "wrap_modules": None, "async_save": True}
    base = {
        "reshard_after_forward": True,
        "checkpoint": "sharded (torch.distributed.checkpoint folder)",
        "timeout_s": 1800.0,
    }
    got = plan(0, scenario="fsdp", devices=2)
    assert got.strategy_args == {**base, "fsdp": fsdp, "wrap_rule": DEFAULT_WRAP_RULE}
    got = plan(0, scenario="fsdp", devices=2, fsdp={"wrap_modules": ["Linear"]})
    wrapped = {**fsdp, "wrap_modules": ["Linear"]}
    assert got.strategy_args == {**base, "fsdp": wrapped, "wrap_rule": "parallel.fsdp.wrap_modules"}
    sync = plan(0, scenario="fsdp", devices=2, fsdp={"async_save": False})
    assert sync.strategy_args["fsdp"]["async_save"] is False


def test_the_zero1_arguments_the_plan_shows():
    got = plan(0, scenario="zero1", devices=2)
    assert got.strategy_args == {
        "ddp": {"find_unused_parameters": False, "broadcast_buffers": True},
        "timeout_s": 1800.0,
        "start_method": "popen",
        "optimizer_state": "sharded over the data-parallel ranks (ZeroRedundancyOptimizer)",
        "checkpoint": "one file (the optimizer state consolidated on rank 0 when saving)",
    }


# --- interactive sessions (a notebook) --------------------------------------------------------------------------


@pytest.fixture
def notebook(monkeypatch):
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)


def test_in_a_notebook_zero1_forks_too(notebook):
    assert plan(0, scenario="zero1", devices=2).strategy_args["start_method"] == "fork"


def test_in_a_notebook_fsdp_is_refused(notebook):
    message = error(0, scenario="fsdp", devices=2)
    assert message.startswith("scenario fsdp starts its processes by running the command again"), message
