"""Table-driven specification of the parallel layer: scenario x hardware -> plan, and every error case."""

from __future__ import annotations

import pytest

from project.errors import UserError
from project.parallel.ddp import ddp_buffer_kwargs
from project.parallel.strategies import trainer_kwargs
from project.plan.environment import LaunchEnvironment, detect_environment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(gpus: int, data_batch: int | None = 64, env: LaunchEnvironment = LOCAL, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), env, data_batch)


# (fields, gpus) -> (scenario, accelerator, devices, world_size, per_device, global, strategy, backend)
CASES = [
    # auto follows the machine
    ({}, 0, ("cpu", "cpu", 1, 1, 64, 64, "single_device", None)),
    ({}, 1, ("single", "gpu", [0], 1, 64, 64, "single_device", None)),
    ({}, 4, ("ddp", "gpu", [0, 1, 2, 3], 4, 64, 256, "ddp", "nccl")),
    ({}, 8, ("ddp", "gpu", list(range(8)), 8, 64, 512, "ddp", "nccl")),
    # cpu: N processes over gloo, whatever the GPUs
    ({"scenario": "cpu"}, 0, ("cpu", "cpu", 1, 1, 64, 64, "single_device", None)),
    ({"scenario": "cpu", "devices": 2}, 0, ("cpu", "cpu", 2, 2, 64, 128, "ddp", "gloo")),
    ({"scenario": "cpu", "devices": 4}, 1, ("cpu", "cpu", 4, 4, 64, 256, "ddp", "gloo")),
    ({"scenario": "cpu", "devices": "2"}, 8, ("cpu", "cpu", 2, 2, 64, 128, "ddp", "gloo")),
    ({"scenario": "cpu", "devices": 2, "num_nodes": 2}, 0, ("cpu", "cpu", 2, 4, 64, 256, "ddp", "gloo")),
    ({"scenario": "cpu", "devices": 2, "global_batch_size": 32}, 0, ("cpu", "cpu", 2, 2, 16, 32, "ddp", "gloo")),
    # single GPU
    ({"scenario": "single"}, 1, ("single", "gpu", [0], 1, 64, 64, "single_device", None)),
    ({"scenario": "single", "devices": [3]}, 4, ("single", "gpu", [3], 1, 64, 64, "single_device", None)),
    ({"scenario": "single"}, 8, ("single", "gpu", [0], 1, 64, 64, "single_device", None)),
    # dp keeps DataParallel's meaning of the batch: the data batch is global, split evenly
    ({"scenario": "dp"}, 1, ("dp", "gpu", [0], 1, 64, 64, "single_device", None)),
    ({"scenario": "dp", "devices": "all"}, 4, ("dp", "gpu", [0, 1, 2, 3], 4, 16, 64, "ddp", "nccl")),
    ({"scenario": "dp", "devices": "all"}, 8, ("dp", "gpu", list(range(8)), 8, 8, 64, "ddp", "nccl")),
    (
        {"scenario": "dp", "devices": [0, 1, 2], "global_batch_size": 63},
        4,
        ("dp", "gpu", [0, 1, 2], 3, 21, 63, "ddp", "nccl"),
    ),
    (
        {"scenario": "dp", "devices": "0,1,2", "global_batch_size": 63},
        8,
        ("dp", "gpu", [0, 1, 2], 3, 21, 63, "ddp", "nccl"),
    ),
    ({"scenario": "dp", "devices": 2, "global_batch_size": 16}, 4, ("dp", "gpu", [0, 1], 2, 8, 16, "ddp", "nccl")),
    # fork: DDP with forked ranks, on the GPUs when there are some, else CPU processes
    ({"scenario": "fork", "devices": 2}, 0, ("fork", "cpu", 2, 2, 64, 128, "ddp_fork", "gloo")),
    ({"scenario": "fork"}, 0, ("fork", "cpu", 1, 1, 64, 64, "single_device", None)),
    ({"scenario": "fork", "devices": "all"}, 4, ("fork", "gpu", [0, 1, 2, 3], 4, 64, 256, "ddp_fork", "nccl")),
    # ddp: the data batch is per device
    ({"scenario": "ddp"}, 1, ("ddp", "gpu", [0], 1, 64, 64, "single_device", None)),
    ({"scenario": "ddp", "devices": "all"}, 4, ("ddp", "gpu", [0, 1, 2, 3], 4, 64, 256, "ddp", "nccl")),
    (
        {"scenario": "ddp", "devices": "all", "backend": "gloo"},
        8,
        ("ddp", "gpu", list(range(8)), 8, 64, 512, "ddp", "gloo"),
    ),
    ({"scenario": "ddp", "devices": [1, 3]}, 4, ("ddp", "gpu", [1, 3], 2, 64, 128, "ddp", "nccl")),
    (
        {"scenario": "ddp", "devices": 4, "num_nodes": 2, "global_batch_size": 64},
        8,
        ("ddp", "gpu", [0, 1, 2, 3], 8, 8, 64, "ddp", "nccl"),
    ),
]


@pytest.mark.parametrize(("fields", "gpus", "expected"), CASES)
def test_scenario_resolution(fields, gpus, expected):
    got = plan(gpus, **fields)
    assert (
        got.scenario,
        got.accelerator,
        got.devices,
        got.world_size,
        got.per_device_batch_size,
        got.global_batch_size,
        got.strategy,
        got.backend,
    ) == expected


# (fields, gpus, words the one-line message must contain)
ERRORS = [
    ({"scenario": "gpu"}, 8, ["'gpu'", "auto, cpu, single, dp, ddp"]),
    ({"scenario": "dp"}, 0, ["'dp'", "needs GPUs", "scenario 'cpu'"]),
    ({"scenario": "ddp", "devices": "all"}, 0, ["'ddp'", "needs GPUs"]),
    ({"scenario": "single"}, 0, ["'single'", "needs GPUs"]),
    ({"scenario": "ddp", "devices": [0, 9]}, 4, ["[9]", "do not exist", "0..3"]),
    ({"scenario": "ddp", "devices": [0, 0, 1]}, 4, ["repeats", "[0]"]),
    ({"scenario": "ddp", "devices": []}, 4, ["empty"]),
    ({"scenario": "ddp", "devices": 0}, 4, ["devices=0", ">= 1"]),
    ({"scenario": "ddp", "devices": 9}, 8, ["devices=9", "at most 8"]),
    ({"scenario": "ddp", "devices": "0,x"}, 8, ["'0,x'"]),
    ({"scenario": "single", "devices": [0, 1]}, 4, ["takes one"]),
    ({"scenario": "dp", "devices": [0, 1, 2], "global_batch_size": 16}, 8, ["16", "world size 3", "15 or 18"]),
    ({"scenario": "dp", "devices": [0, 1, 2]}, 8, ["64", "world size 3", "63 or 66"]),
    ({"scenario": "dp", "devices": "all", "num_nodes": 2}, 8, ["num_nodes=2", "'dp'", "'ddp'"]),
    ({"scenario": "cpu", "devices": "all"}, 0, ["'all'", "number of processes"]),
    ({"scenario": "fork", "devices": [0, 1]}, 0, ["[0, 1]", "'fork' on CPU", "number of processes"]),
    ({"scenario": "cpu", "devices": [0, 1]}, 0, ["[0, 1]", "number of processes"]),
    ({"scenario": "cpu", "devices": 0}, 0, ["devices=0", ">= 1"]),
    ({"scenario": "cpu", "num_nodes": 0}, 0, ["num_nodes=0", ">= 1"]),
    ({"scenario": "cpu", "devices": 2, "sync_batchnorm": True}, 0, ["sync_batchnorm", "GPUs"]),
    ({"scenario": "cpu", "devices": 2, "backend": "nccl"}, 0, ["'nccl'", "gloo"]),
    ({"scenario": "cpu", "devices": 2, "backend": "mpi"}, 0, ["'mpi'", "auto, nccl, gloo"]),
    ({"scenario": "cpu", "global_batch_size": 0}, 0, ["global_batch_size=0", ">= 1"]),
    ({"scenario": "cpu", "timeout_s": 0}, 0, ["timeout_s=0", "> 0"]),
]


@pytest.mark.parametrize(("fields", "gpus", "words"), ERRORS)
def test_errors_name_value_rule_and_fix(fields, gpus, words):
    with pytest.raises(UserError) as info:
        plan(gpus, **fields)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_data_batch_size_must_be_positive():
    with pytest.raises(UserError, match=r"batch_size=0 must be >= 1"):
        plan(0, data_batch=0)


def test_plan_json_keys_and_seed_buffer_flag():
    data = plan(8, scenario="ddp", devices="all", ddp={"broadcast_buffers": False}).to_dict()
    assert {
        "scenario",
        "accelerator",
        "devices",
        "strategy",
        "num_nodes",
        "world_size",
        "per_device_batch_size",
        "global_batch_size",
        "backend",
        "launcher",
        "notes",
    } <= set(data)
    assert data["strategy"]["name"] == "ddp"
    assert data["strategy"]["ddp"] == {"find_unused_parameters": False, "broadcast_buffers": False}


def test_broadcast_buffers_maps_to_the_installed_torch_name_without_warning(recwarn):
    kwargs = ddp_buffer_kwargs(False)
    assert kwargs in ({"forward_sync_buffers": False}, {"broadcast_buffers": False})
    strategy = trainer_kwargs(plan(0, scenario="cpu", devices=2, ddp={"broadcast_buffers": False}))["strategy"]
    assert kwargs.items() <= strategy._ddp_kwargs.items()
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]


def test_dp_explains_the_translation():
    notes = " ".join(plan(4, scenario="dp", devices="all").notes)
    assert "DDP" in notes and "16 per GPU" in notes


def test_external_launcher_sets_the_layout():
    env = LaunchEnvironment(launcher="torchrun", external=True, world_size=4, local_world_size=2, num_nodes=2)
    got = plan(0, env=env, scenario="cpu")
    assert (got.devices, got.num_nodes, got.world_size, got.launcher) == (2, 2, 4, "torchrun")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"scenario": "cpu", "devices": 3}, ["devices=3", "torchrun", "started 2"]),
        ({"scenario": "cpu", "num_nodes": 1}, ["num_nodes=1", "torchrun", "started 2"]),
    ],
)
def test_config_that_disagrees_with_the_launcher_names_both(fields, words):
    env = LaunchEnvironment(launcher="torchrun", external=True, world_size=4, local_world_size=2, num_nodes=2)
    with pytest.raises(UserError) as info:
        plan(0, env=env, **fields)
    for word in words:
        assert word in str(info.value)


def test_environment_detection():
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "3", "GROUP_RANK": "1"}
    env = detect_environment(torchrun)
    assert (env.launcher, env.external, env.num_nodes, env.rank, env.node_rank) == ("torchrun", True, 2, 3, 1)
    legacy = detect_environment({**torchrun, "PROJECT_LEGACY_LAUNCH": "1"})
    assert legacy.launcher == "torch.distributed.launch"
    slurm = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2(x2)", "SLURM_NNODES": "2", "SLURM_JOB_NAME": "train"}
    env = detect_environment(slurm)
    assert (env.launcher, env.world_size, env.local_world_size, env.num_nodes) == ("slurm", 4, 2, 2)
    assert detect_environment({**slurm, "SLURM_JOB_NAME": "bash"}).launcher == "lightning"
    assert detect_environment({}) == LaunchEnvironment(launcher="lightning", external=False)


# Any two of (global, per-device, accumulation) decide the third at the world size; the loader's batch fills in.
# (scenario, global, data batch, world size, per-device, accumulation) -> (per-device, global, accumulation)
BATCH_MATH = [
    (("ddp", None, 64, 4, None, None), (64, 256, 1)),
    (("ddp", 256, 64, 4, 16, None), (16, 256, 4)),
    (("ddp", 256, 64, 4, None, 2), (32, 256, 2)),
    (("ddp", None, 64, 4, 16, 4), (16, 256, 4)),
    (("ddp", 256, 64, 4, 16, 4), (16, 256, 4)),
    (("cpu", None, 64, 1, None, 4), (64, 256, 4)),
    (("dp", None, 64, 4, None, None), (16, 64, 1)),
    (("dp", None, 64, 4, None, 2), (8, 64, 2)),
]


@pytest.mark.parametrize(("given", "expected"), BATCH_MATH)
def test_batch_math_derives_the_third_number(given, expected):
    from project.plan.batch import resolve_batch
    from project.plan.scenarios import SCENARIOS

    scenario, global_, data, world, per_device, accumulation = given
    got = resolve_batch(SCENARIOS[scenario].data_batch_is_global, global_, data, world, per_device, accumulation)
    assert (got.per_device, got.global_, got.accumulation) == expected


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"global_batch_size": 256, "per_device_batch_size": 24}, ["256", "per_device_batch_size 24", "192 or 288"]),
        ({"global_batch_size": 100, "accumulation": 3}, ["100", "accumulation 3", "96 or 108"]),
        (
            {"global_batch_size": 256, "per_device_batch_size": 16, "accumulation": 2},
            ["256", "16 x world size 4 x accumulation 2", "give two of the three"],
        ),
        ({"accumulation": 0}, ["accumulation=0", ">= 1"]),
    ],
)
def test_batch_math_refuses_what_does_not_divide_with_the_nearest_values(fields, words):
    with pytest.raises(UserError) as info:
        plan(0, scenario="cpu", devices=4, **fields)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_the_plan_owns_the_accumulation_and_says_it():
    got = plan(0, scenario="cpu", devices=4, global_batch_size=256, per_device_batch_size=16)
    assert trainer_kwargs(got)["accumulate_grad_batches"] == 4 and got.to_dict()["accumulation"] == 4
    assert any("4 micro-batches of 16" in note for note in got.notes)
