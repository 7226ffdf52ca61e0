"""All ranks start at once: ``python -m project`` forks ranks 1..N-1 of a CPU run right after its imports.

The pre-parse that decides it is a table (command line and config files -> N processes, or ``None`` for
Lightning's launcher), checked against the real parser. Real 2-process runs show that rank 1 exists before
rank 0 parsed its config (under Lightning's launcher it starts at ``trainer.fit``), that both ways train to the
same weights, that a refusal is one line and leaves no process, and that a rank lost before the ranks met is
named. Stamps come from a test-only callback (tests/extras/early/early_launch_probe.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from project.errors import UserError
from project.extras.early import ranks as forked
from project.extras.early.preparse import processes_to_start
from project.launch import ranks
from project.plan.environment import detect_environment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

from helpers import CONFIGS, CPU_DDP, DIGITS, FAST, has_layer, run_cli, run_dirs, two_at_a_time

PARALLEL = CONFIGS / "parallel"
SHORT = ["--config", FAST, "--trainer.max_steps", "3", "--test_after_fit", "false"]
PROBE = "--trainer.callbacks+=early_launch_probe.StartStamps"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Small config files that each set part of the ``parallel`` section."""
    folder = tmp_path_factory.mktemp("sections")
    texts = {
        "timeout": "parallel:\n  timeout_s: 10\n",
        "three": "parallel:\n  devices: 3\n",
        "null": "parallel: null\n",
        "trainer": "trainer:\n  max_steps: 3\n",
        "quoted": "parallel:\n  devices: '2'\n",
        "ids": "parallel:\n  devices: [0, 1]\n",
        "unknown": "parallel:\n  gpus: 2\n",
        "nested": f"config: {CPU_DDP}\n",
        "list": "- parallel\n",
        "subsection": "parallel:\n  ddp:\n    find_unused_parameters: true\n",
    }
    for name, text in texts.items():
        (folder / f"{name}.yaml").write_text(text)
    return {name: str(folder / f"{name}.yaml") for name in texts}


D, C = ["--config", DIGITS], ["--config", CPU_DDP]
# (argv after `python -m project`, with {file} names from `files`; processes started at once, or None)
TABLE = {
    "cpu_ddp": (["fit", *D, *C], 2),
    "devices-overridden": (["fit", *D, *C, "--parallel.devices", "4"], 4),
    "devices-overridden-with-equals": (["fit", *D, *C, "--parallel.devices=3"], 3),
    "one-process": (["fit", *D, *C, "--parallel.devices", "1"], None),
    "override-before-the-file-loses": (["fit", *D, "--parallel.devices=4", *C], 2),
    "auto-without-devices": (["fit", *D], None),
    "later-file-merges-fields": (["fit", *D, *C, "--config", "{timeout}"], 2),
    "later-file-sets-devices": (["fit", *D, *C, "--config", "{three}"], 3),
    "other-sections-only": (["fit", *D, *C, "--config", "{trainer}"], 2),
    "null-drops-the-section": (["fit", *D, *C, "--config", "{null}"], None),
    "null-then-an-override-starts-afresh": (["fit", *D, *C, "--config", "{null}", "--parallel.devices", "2"], 2),
    "devices-as-a-yaml-string": (["fit", *D, *C, "--config", "{quoted}"], 2),
    "gpu-ids": (["fit", *D, *C, "--config", "{ids}"], None),
    "fork-starts-its-own": (["fit", *D, "--config", str(PARALLEL / "fork.yaml")], None),
    "ddp-needs-gpus": (["fit", *D, "--config", str(PARALLEL / "ddp.yaml")], None),
    "two-nodes": (["fit", *D, *C, "--parallel.num_nodes", "2"], None),
    "one-node": (["fit", *D, *C, "--parallel.num_nodes", "1"], 2),
    "ray": (["fit", *D, *C, "--parallel.launcher", "ray"], None),
    "validate": (["validate", *D, *C, "--ckpt_path", "none"], 2),
    "check": (["check", *D, *C], 2),
    "plan-starts-nothing": (["plan", *D, *C], None),
    "help": (["fit", *D, *C, "--help"], None),
    "print-config": (["fit", *D, *C, "--print_config"], None),
    "inline-section": (["fit", *D, *C, "--parallel", '{"devices": 4}'], None),
    "inline-config": (["fit", *D, "--config", '{"parallel": {"scenario": "cpu", "devices": 2}}'], None),
    "missing-file": (["fit", *D, "--config", "nowhere.yaml"], None),
    "unknown-field-on-the-command-line": (["fit", *D, *C, "--parallel.gpus", "2"], None),
    "abbreviated-field": (["fit", *D, *C, "--parallel.dev", "4"], None),
    "unknown-field-in-a-file": (["fit", *D, *C, "--config", "{unknown}"], None),
    "nested-config": (["fit", *D, "--config", "{nested}"], None),
    "not-a-mapping": (["fit", *D, *C, "--config", "{list}"], None),
    "quoted-number": (["fit", *D, *C, "--parallel.devices", "'2'"], None),
    "signed-number": (["fit", *D, *C, "--parallel.devices", "+2"], None),
    "value-missing": (["fit", *D, *C, "--parallel.devices"], None),
    # A subsection's field decides no process count; an old flat name is the parser's to refuse.
    "subsection-field-on-the-command-line": (["fit", *D, *C, "--parallel.ddp.find_unused_parameters", "true"], 2),
    "subsection-in-a-file": (["fit", *D, *C, "--config", "{subsection}"], 2),
    "old-flat-name": (["fit", *D, *C, "--parallel.broadcast_buffers", "false"], None),
}
if has_layer("sharding"):  # a scenario on the GPUs when there are some, else CPU processes: the layer's fsdp
    TABLE["cpu-fsdp"] = (["fit", *D, "--config", str(CONFIGS / "sharding" / "cpu_fsdp.yaml")], 2)
# Rows whose answer is a count, which the real parser and plan must agree with.
COUNTED = [name for name, (_, expected) in TABLE.items() if expected is not None]


def argv_of(name: str, files: dict[str, str]) -> list[str]:
    return [files.get(arg.strip("{}"), arg) if re.fullmatch(r"\{\w+\}", arg) else arg for arg in TABLE[name][0]]


@pytest.mark.parametrize("name", list(TABLE))
def test_the_pre_parse_reads_what_it_is_sure_of(files, name):
    assert processes_to_start(argv_of(name, files), environ={}, gpus_possible=False) == TABLE[name][1]


@pytest.mark.parametrize(
    ("environ", "gpus", "config", "expected"),
    [
        ({"LOCAL_RANK": "1"}, False, CPU_DDP, None),  # a rank some launcher started
        ({"TORCHELASTIC_RUN_ID": "x"}, False, CPU_DDP, None),
        ({"SLURM_NTASKS": "2"}, False, CPU_DDP, None),
        ({"RANK": "0"}, False, CPU_DDP, None),
        ({"PROJECT_EARLY_LAUNCH": "0"}, False, CPU_DDP, None),
        ({"JSONARGPARSE_DEFAULT_ENV": "true"}, False, CPU_DDP, None),
        ({}, True, CPU_DDP, 2),  # scenario cpu: CPU processes next to GPUs too
        *(
            [
                ({}, True, str(CONFIGS / "sharding" / "cpu_fsdp.yaml"), None),  # fsdp would run on the GPUs
                ({"CUDA_VISIBLE_DEVICES": ""}, None, str(CONFIGS / "sharding" / "cpu_fsdp.yaml"), 2),  # GPUs hidden
            ]
            if has_layer("sharding")  # the layer's scenario fsdp
            else []
        ),
    ],
)
def test_the_pre_parse_leaves_other_launchers_and_gpus_alone(environ, gpus, config, expected):
    assert processes_to_start(["fit", *D, "--config", config], environ, gpus_possible=gpus) == expected


@pytest.mark.parametrize("name", COUNTED)
def test_the_parser_and_the_plan_agree_with_the_pre_parse(files, name):
    from project.build import ProjectCLI

    argv = argv_of(name, files)
    cli = ProjectCLI("plan", [arg for arg in argv[1:] if arg not in ("--ckpt_path", "none")])
    settings = cli.state.section
    plan = resolve_plan(settings, Hardware(0), detect_environment({}), None)
    assert (plan.devices, plan.num_nodes, plan.launcher) == (TABLE[name][1], 1, "lightning")


def test_a_plan_that_disagrees_with_the_started_ranks_stops_them_and_is_one_line(monkeypatch):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    started = forked.StartedRanks([forked.ForkedRank(sleeper.pid, 1)], {"WORLD_SIZE": "2"}, "then run it again")
    monkeypatch.setattr(ranks, "_STARTED", None)
    ranks.register(started)
    three = resolve_plan(ParallelConfig(scenario="cpu", devices=3), Hardware(0), detect_environment({}), None)
    with pytest.raises(UserError, match=r"2 processes were started at once .* resolves to 3 process\(es\) per node"):
        ranks.confirm_started_ranks(three)
    assert started.ranks[0].returncode == -9 and started.ending


def test_a_plan_that_agrees_sets_what_lightnings_launcher_would(monkeypatch):
    for key in ("LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.setenv(key, "unset")  # restored after the test
    environment = {"WORLD_SIZE": "2", "MASTER_PORT": "29511"}
    monkeypatch.setattr(ranks, "_STARTED", forked.StartedRanks([forked.ForkedRank(os.getpid(), 1)], environment, ""))
    two = resolve_plan(ParallelConfig(scenario="cpu", devices=2), Hardware(0), detect_environment({}), None)
    ranks.confirm_started_ranks(two)
    assert [os.environ[key] for key in ("LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")] == ["0", "2", "29511"]


# --------------------------------------------------------------------------- real processes
def alive_with_tag(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``EARLY_RUN=tag``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit():
                continue
            tagged = f"EARLY_RUN={tag}".encode() in (proc / "environ").read_bytes().split(b"\0")
            if tagged and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def tagged_run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI in ``cwd``; afterwards no process of it may be alive."""
    cwd.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    result = run_cli(args, cwd, env={"EARLY_RUN": tag, **(env or {})}, timeout=240)
    assert alive_with_tag(tag) == [], "processes of the run are still alive:\n" + result.stderr[-3000:]
    return result


def stamps(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.distributed
def test_rank_one_starts_before_rank_zero_parses_and_both_ways_train_alike(tmp_path):
    def fit(way: str, env: dict[str, str]):
        cwd = tmp_path / way
        probe = [PROBE, "--trainer.callbacks.init_args.folder", str(cwd / "stamps")]
        return tagged_run(["fit", *D, *C, *SHORT, *probe], cwd, env)

    at_once, lightning = two_at_a_time(
        lambda: fit("at_once", {}), lambda: fit("lightning", {"PROJECT_EARLY_LAUNCH": "0"})
    )
    for result in (at_once, lightning):
        assert result.returncode == 0, result.stderr[-3000:]
    zero, one = stamps(tmp_path / "at_once" / "stamps")
    # Rank 0 started rank 1 before it parsed the config (the probe is imported while the callbacks are built).
    assert one["ppid"] == zero["pid"] and one["started_boot_s"] < zero["imported_boot_s"], (zero, one)
    zero, one = stamps(tmp_path / "lightning" / "stamps")
    assert one["started_boot_s"] > zero["imported_boot_s"], "Lightning's launcher starts rank 1 at trainer.fit"
    runs = [run_dirs(tmp_path / way) for way in ("at_once", "lightning")]
    assert all(len(found) == 1 for found in runs), runs  # one run directory each: rank 0 reserved it
    (early,), (late,) = runs
    assert json.loads((early / "plan.json").read_text())["runtime"]["cluster_environment"] == "LightningEnvironment"
    got, want = (torch.load(run / "checkpoints" / "last.ckpt", weights_only=True) for run in (early, late))
    assert got["global_step"] == want["global_step"] == 3
    for key, value in want["state_dict"].items():
        assert torch.equal(got["state_dict"][key], value), key


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--trainer.devices", "3"], "trainer.devices='3' and the parallel section"),  # refused by every rank's build
        (["--parallel.backend", "mpi"], "parallel.backend='mpi'"),  # refused by every rank's parser
    ],
    ids=["build", "parser"],
)
def test_a_refusal_is_one_line_from_rank_zero_and_leaves_no_process(tmp_path, extra, needle):
    result = tagged_run(["fit", *D, *C, *SHORT, *extra], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if re.match(r"(\[rank \d+\] )?error: ", line)]
    assert len(errors) == 1 and errors[0].startswith("error: ") and needle in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr and run_dirs(tmp_path) == []


@pytest.mark.distributed
def test_a_rank_lost_before_the_ranks_meet_is_named_and_the_run_ends(tmp_path):
    die = "--trainer.callbacks+=early_launch_probe.DieWhileBuilding"
    result = tagged_run(["fit", *D, *C, *SHORT, "--parallel.timeout_s", "600", die], tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.search(r"^error: rank 1 \(pid \d+\) was killed by SIGKILL", result.stderr, re.M), result.stderr


@pytest.mark.distributed
def test_when_rank_zero_is_killed_the_forked_ranks_end_with_it(tmp_path):
    kill = ["--trainer.callbacks+=faults.KillAtStep", "--trainer.callbacks.init_args.step", "2"]
    result = tagged_run(["fit", *D, *C, *SHORT, *kill, "--trainer.callbacks.init_args.rank", "0"], tmp_path)
    assert result.returncode == -9, result.stderr[-3000:]
