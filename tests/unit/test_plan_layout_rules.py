"""Where the processes go and what the plan says about them, at the edges (from the mutation pass,
docs/mutation-plan.md): device strings, the GPU count limits, an outside launcher's numbers, the
settings notes, precision, and the interactive start method.
"""

from __future__ import annotations

import sys
import types
from dataclasses import fields

import pytest

from project.config_errors import _unknown_option
from project.errors import UserError
from project.plan.config import MOVED_FIELDS
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, LaunchMismatchError, ParallelConfig, resolve_plan
from project.plan.scenarios import SCENARIO_NAMES
from project.plan.strategies import is_interactive

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(gpus: int, env: LaunchEnvironment = LOCAL, data_batch: int | None = 64, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), env, data_batch)


def error(gpus: int, env: LaunchEnvironment = LOCAL, kind: type[Exception] = UserError, **fields) -> str:
    with pytest.raises(kind) as info:
        plan(gpus, env, **fields)
    return str(info.value)


def torchrun(world: int, local: int | None, **fields) -> LaunchEnvironment:
    return LaunchEnvironment(launcher="torchrun", external=True, world_size=world, local_world_size=local, **fields)


# --- parallel.devices ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("devices", [-1, "-1", "all", None])
def test_every_way_of_saying_all_gpus(devices):
    assert plan(4, scenario="ddp", devices=devices).devices == [0, 1, 2, 3]


@pytest.mark.parametrize(("devices", "ids"), [("[0, 1]", [0, 1]), (" [1,3] ", [1, 3]), ("3,", [3]), ("1,2", [1, 2])])
def test_a_string_with_brackets_or_a_comma_is_a_list_of_gpu_ids(devices, ids):
    assert plan(4, scenario="ddp", devices=devices).devices == ids


def test_a_count_of_one_and_a_count_of_every_gpu_are_legal():
    assert (plan(4, scenario="ddp", devices=1).devices, plan(4, scenario="ddp", devices=1).world_size) == ([0], 1)
    assert plan(4, scenario="ddp", devices=4).devices == [0, 1, 2, 3]
    assert "asks for more GPUs than this machine has (4)" in error(4, scenario="ddp", devices=5)


def test_the_last_gpu_id_exists_and_the_next_does_not():
    assert plan(4, scenario="ddp", devices=[3]).devices == [3]
    message = error(4, scenario="ddp", devices=[4])
    assert "GPU id(s) [4] do not exist (valid ids: 0..3)" in message, message


def test_without_gpus_no_id_is_valid():
    from project.plan.devices import gpu_ids, parse_devices

    with pytest.raises(UserError, match="valid ids: none: no GPU is visible"):
        gpu_ids(parse_devices([0]), 0)


@pytest.mark.parametrize(
    ("devices", "words"),
    [
        (True, "parallel.devices=True is not 'all', a count or a list of GPU ids"),
        ([-1], "parallel.devices=[-1] must list GPU ids (whole numbers >= 0)"),
        ([0, True], "parallel.devices=[0, True] must list GPU ids (whole numbers >= 0)"),
        ([], "parallel.devices=[] is empty"),
        ("X1", "parallel.devices='X1' is not 'all', a count or a list of GPU ids"),
    ],
)
def test_what_is_not_a_device_request_is_refused_in_one_line(devices, words):
    assert words in error(4, scenario="ddp", devices=devices)


# --- scenario auto and GPU scenarios ---------------------------------------------------------------------------


def test_auto_runs_ddp_from_two_gpus_unless_one_device_is_asked():
    assert (plan(2).scenario, plan(2).world_size) == ("ddp", 2)
    assert (plan(4, devices=2).scenario, plan(4, devices=2).devices) == ("ddp", [0, 1])
    assert plan(4, devices=1).scenario == "single"


def test_a_gpu_scenario_without_gpus_repeats_the_devices_asked():
    assert error(0, scenario="ddp", devices=2).startswith("parallel.scenario='ddp' with devices=2 needs GPUs")
    assert error(0, scenario="ddp").startswith("parallel.scenario='ddp' needs GPUs but no GPU is visible")


def test_a_choice_built_in_code_is_checked_with_its_full_name():
    """The parser checks a ``Literal`` choice; a config built in code gets the same one line."""
    assert error(0, scenario="tpu") == f"parallel.scenario='tpu' is not one of {', '.join(SCENARIO_NAMES)}"


def test_the_flat_names_of_earlier_versions_map_to_their_subsections():
    assert {old: new for old, new in MOVED_FIELDS.items() if new.startswith("ddp.")} == {
        "find_unused_parameters": "ddp.find_unused_parameters",
        "broadcast_buffers": "ddp.broadcast_buffers",
    }
    # Each new name is a field of its subsection, and no old name is a field of the section any more.
    flat = {field.name for field in fields(ParallelConfig)}
    for old, new in MOVED_FIELDS.items():
        section, _, name = new.partition(".")
        assert old not in flat and hasattr(getattr(ParallelConfig(), section), name)


def test_an_option_of_a_stripped_layer_names_the_layer_and_a_moved_one_its_new_name():
    message = "Parser key \"parallel\":\n  Option 'lr_scaling' is not accepted"
    assert _unknown_option(message, {}) == (
        "parallel.lr_scaling needs the lr layer (project/extras/lr), which this checkout does not have; remove it"
    )
    moved = {"parallel.lr_scaling": "parallel.learning_rate.lr_scaling"}  # the layer is present: its new name
    assert _unknown_option(message, moved).startswith("parallel.lr_scaling is now parallel.learning_rate.lr_scaling")
    unknown = "Parser key \"parallel\":\n  Option 'lr_scale' is not accepted"
    assert _unknown_option(unknown, {}) == "unknown option 'lr_scale' in parallel"


# --- an outside launcher's numbers -----------------------------------------------------------------------------


def test_torchrun_on_gpus_decides_the_processes_per_node():
    got = plan(4, torchrun(2, 2), scenario="ddp")
    assert (got.devices, got.world_size, got.launcher) == ([0, 1], 2, "torchrun")
    assert plan(4, torchrun(4, 4), scenario="ddp").devices == [0, 1, 2, 3]
    message = error(4, torchrun(8, 8), LaunchMismatchError, scenario="ddp")
    assert message == "torchrun started 8 processes per node but this machine has 4 GPUs; launch at most 4"


def test_gpu_ids_that_disagree_with_torchrun_name_its_flag():
    message = error(4, torchrun(2, 2), LaunchMismatchError, scenario="ddp", devices=[0, 1, 2])
    assert message.startswith(
        "parallel.devices=3 disagrees with torchrun, which started 2 (--nproc_per_node (LOCAL_WORLD_SIZE))"
    )
    assert plan(4, torchrun(2, 2), scenario="ddp", devices=[2, 3]).devices == [2, 3]


def test_a_slurm_mismatch_names_slurms_option():
    slurm = LaunchEnvironment(launcher="slurm", external=True, world_size=4, local_world_size=2, num_nodes=2)
    message = error(0, slurm, LaunchMismatchError, scenario="cpu", devices=4)
    assert "which started 2 (--ntasks-per-node (SLURM_NTASKS_PER_NODE))" in message, message


def test_a_world_size_the_launcher_set_must_match_the_plan():
    """An uneven placement gives no node count: the WORLD_SIZE check is what catches the difference."""
    message = error(0, torchrun(3, 2), LaunchMismatchError, scenario="cpu")
    assert message.startswith("the plan has world size 2 (devices 2 x nodes 1) but torchrun set WORLD_SIZE=3;")


def test_lightnings_own_launcher_does_not_impose_its_variables():
    """A process Lightning's launcher started carries WORLD_SIZE; the config still decides the layout."""
    env = LaunchEnvironment(launcher="lightning", external=False, world_size=8, local_world_size=8, num_nodes=4)
    got = plan(0, env, scenario="cpu", devices=2)
    assert (got.world_size, got.num_nodes, got.launcher) == (2, 1, "lightning")


# --- plan fields and setting notes ------------------------------------------------------------------------------


def test_the_launcher_is_none_only_for_one_process_that_nobody_started():
    assert plan(0, scenario="cpu").launcher == "none"
    assert plan(0, scenario="cpu", devices=2).launcher == "lightning"
    assert plan(0, torchrun(1, 1), scenario="cpu").launcher == "torchrun"


def test_the_cluster_environment_is_passed_for_several_processes_only():
    kubeflow = "lightning.pytorch.plugins.environments.KubeflowEnvironment"

    def pods(world: int) -> LaunchEnvironment:
        return LaunchEnvironment(
            launcher="kubeflow",
            external=True,
            world_size=world,
            local_world_size=1,
            num_nodes=world,
            rank=0,
            local_rank=0,
            node_rank=0,
            cluster_environment=kubeflow,
        )

    assert plan(0, pods(2), scenario="cpu").cluster_environment == kubeflow
    assert "cluster_environment" not in plan(0, pods(2), scenario="cpu").launch  # shown once, beside the launcher
    assert plan(0, pods(1), scenario="cpu").cluster_environment is None


def test_the_plan_carries_precision_sync_batchnorm_and_the_launch():
    got = plan(4, scenario="ddp", devices=2, precision="bf16-mixed", sync_batchnorm=True)
    assert (got.precision, got.sync_batchnorm) == ("bf16-mixed", True)
    assert got.launch == {"node_rank": 0, "ranks_on_this_node": [0, 1], "master_addr": "127.0.0.1"}
    assert got.strategy_args["start_method"] == "popen"


def test_a_timeout_below_one_second_is_legal():
    assert plan(0, scenario="cpu", devices=2, timeout_s=0.5).strategy_args["timeout_s"] == 0.5


def test_the_buffers_note_is_for_several_processes_that_do_not_broadcast():
    def says(**fields) -> bool:
        notes = plan(0, scenario="cpu", **fields).notes
        return any(note.startswith("ddp.broadcast_buffers=false") for note in notes)

    assert says(devices=2, ddp={"broadcast_buffers": False})
    assert not says(devices=1, ddp={"broadcast_buffers": False})
    assert not says(devices=2, ddp={"broadcast_buffers": True})


@pytest.mark.parametrize(
    ("gpus", "precision", "note"),
    [
        (
            0,
            "bf16-mixed",
            "precision bf16-mixed: CPU autocast to bfloat16; parameters, gradients and optimizer state stay float32",
        ),
        (
            4,
            "bf16-mixed",
            "precision bf16-mixed: CUDA autocast to bfloat16; parameters, gradients and optimizer state stay float32",
        ),
        (
            4,
            "16-mixed",
            "precision 16-mixed: CUDA autocast to float16 with a gradient scaler; parameters, gradients "
            "and optimizer state stay float32",
        ),
    ],
)
def test_mixed_precision_says_what_autocasts_to_what(gpus, precision, note):
    scenario = "cpu" if gpus == 0 else "ddp"
    assert note in plan(gpus, scenario=scenario, devices=2, precision=precision).notes


def test_precision_32_adds_no_note_and_16_mixed_needs_gpus():
    assert plan(4, scenario="ddp", devices=2).notes == ()  # nothing to say about a plain ddp run
    message = error(0, scenario="cpu", precision="16-mixed")
    assert message.startswith("parallel.precision='16-mixed' needs GPUs") and "on CPU use 'bf16-mixed'" in message


# --- interactive sessions (a notebook) --------------------------------------------------------------------------


@pytest.fixture
def notebook(monkeypatch):
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)


def test_a_notebook_is_interactive_and_a_process_that_imported_ipykernel_is_not(monkeypatch):
    monkeypatch.delattr(sys, "ps1", raising=False)
    if sys.flags.interactive:
        pytest.skip("python -i")
    # A test runner that executes notebooks imports ipykernel and IPython, and runs no shell: not interactive
    # (fsdp would otherwise be refused in it, as in a notebook).
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    no_shell = types.ModuleType("IPython")
    no_shell.get_ipython = lambda: None
    monkeypatch.setitem(sys.modules, "IPython", no_shell)
    assert not is_interactive()
    shell = types.ModuleType("IPython")
    shell.get_ipython = lambda: object()  # a notebook's kernel: a running shell
    monkeypatch.setitem(sys.modules, "IPython", shell)
    assert is_interactive()
    monkeypatch.setitem(sys.modules, "IPython", no_shell)
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    assert is_interactive()


def test_in_a_notebook_ddp_forks_its_processes_and_says_so(notebook):
    got = plan(0, scenario="cpu", devices=2)
    assert got.strategy_args["start_method"] == "fork"
    assert "interactive session: processes are started by fork" in got.notes
    one = plan(0, scenario="cpu")
    assert "interactive session: processes are started by fork" not in one.notes


def test_processes_an_outside_launcher_started_are_not_forked(notebook):
    got = plan(0, torchrun(2, 2), scenario="cpu")
    assert got.strategy_args["start_method"] == "popen"
    assert "interactive session: processes are started by fork" not in got.notes


# --- parallel.stop_signals and stop_grace_s -----------------------------------------------------------------------


def test_every_catchable_stop_signal_is_accepted():
    signals = ["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGXCPU"]
    assert plan(0, scenario="cpu", devices=2, stop_signals=signals).world_size == 2


@pytest.mark.parametrize("name", ["SIGKILL", "SIGSTOP", "SIGTERMX"])
def test_a_signal_a_fit_cannot_stop_on_is_refused_with_the_choices(name):
    message = error(0, scenario="cpu", stop_signals=["SIGTERM", name])
    assert message.startswith(f"parallel.stop_signals lists {name!r}, which a fit cannot stop on"), message
    assert "SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP, SIGQUIT, SIGXCPU" in message


def test_the_stop_grace_is_any_positive_time():
    assert plan(0, scenario="cpu", stop_grace_s=0.5).world_size == 1
    assert error(0, scenario="cpu", stop_grace_s=0) == "parallel.stop_grace_s=0 must be > 0 seconds"
