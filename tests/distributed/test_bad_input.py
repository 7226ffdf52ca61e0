"""Every bad input of issue 6: exit code != 0 within seconds, one ``error:`` line naming the bad value, no
traceback, and an existing run directory left exactly as it was (no file touched, no new version).

Each case runs the CLI as a user would, in its own folder that already holds a finished run. The cases run
two at a time (each CLI start costs a few seconds of imports); the table below is the specification.
Cases about GPU ids use ``plan --assume_gpus N``: the same resolution ``fit`` runs on an N-GPU machine.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import torch

from project.models.digits_net import DigitsNet

from helpers import CONFIGS, CPU_DDP, DIGITS, FAST, free_port, run_cli, run_dirs, two_at_a_time

# The upper bound of "within seconds": a refusal takes 1-5 s, but two side by side beside another xdist worker on
# 2 cores once took 31 s; a refusal that waited for a collective would take cpu_ddp.yaml's timeout_s (120 s).
SECONDS = 60
BASE = ["--config", DIGITS, "--config", FAST]
RUN = "logs/digits/version_0"
FORK = str(CONFIGS / "parallel" / "fork.yaml")
OWN = ("--config", str(CONFIGS / "own_module.yaml"), "--config", FAST)


@dataclass(frozen=True)
class Case:
    """One bad input: the command line (``{run}``/``{tmp}`` filled in), extra environment, and what the error names."""

    args: tuple[str, ...]
    needles: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    #: Words the error must not contain (advice that does not apply).
    absent: tuple[str, ...] = ()
    #: Paths (relative to the case's folder) that must not exist afterwards: a run written outside logs/.
    outside: tuple[str, ...] = ()


def torchrun_env(world_size: int, local_world_size: int) -> dict[str, str]:
    """What torchrun sets for rank 0 of a job of ``world_size`` processes, ``local_world_size`` per node."""
    return {
        "TORCHELASTIC_RUN_ID": "bad-input",
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }


CASES = {
    "gpu-id-does-not-exist": Case(
        ("plan", *BASE, "--assume_gpus", "2", "--parallel.scenario", "ddp", "--parallel.devices", "[0, 7]"),
        ("parallel.devices=[0, 7]", "[7] do not exist"),
    ),
    "duplicate-gpu-ids": Case(
        ("plan", *BASE, "--assume_gpus", "2", "--parallel.scenario", "ddp", "--parallel.devices", "[1, 1]"),
        ("parallel.devices=[1, 1]", "repeats"),
    ),
    "empty-device-list": Case(
        ("plan", *BASE, "--assume_gpus", "2", "--parallel.scenario", "ddp", "--parallel.devices", "[]"),
        ("parallel.devices=[]", "empty"),
    ),
    "devices-all-without-gpu": Case(
        ("fit", *BASE, "--parallel.scenario", "ddp", "--parallel.devices", "all"),
        ("scenario='ddp'", "devices='all'", "no GPU"),
    ),
    "gpu-ids-without-gpu": Case(
        ("fit", *BASE, "--parallel.scenario", "dp", "--parallel.devices", "[0, 1, 2]"),
        ("scenario='dp'", "devices=[0, 1, 2]", "no GPU"),
    ),
    "global-batch-does-not-divide": Case(
        ("fit", *BASE, "--config", CPU_DDP, "--parallel.global_batch_size", "63"),
        ("global_batch_size=63", "world size 2", "62 or 64"),
    ),
    "batch-size-zero": Case(("fit", *BASE, "--data.init_args.batch_size", "0"), ("batch_size=0",)),
    "num-nodes-zero": Case(("fit", *BASE, "--parallel.num_nodes", "0"), ("num_nodes=0",)),
    "sync-batchnorm-on-cpu": Case(
        ("fit", *BASE, "--config", CPU_DDP, "--parallel.sync_batchnorm", "true"), ("sync_batchnorm", "CPU")
    ),
    "unknown-scenario": Case(("fit", *BASE, "--parallel.scenario", "tpu"), ("scenario='tpu'",)),
    "nccl-on-cpu": Case(("fit", *BASE, "--config", CPU_DDP, "--parallel.backend", "nccl"), ("backend='nccl'",)),
    "mpi-backend": Case(("fit", *BASE, "--config", CPU_DDP, "--parallel.backend", "mpi"), ("backend='mpi'",)),
    "broken-yaml": Case(("fit", *BASE, "--config", "{tmp}/broken.yaml"), ("broken.yaml", "not valid YAML")),
    "missing-config-file": Case(("fit", *BASE, "--config", "{tmp}/nowhere.yaml"), ("nowhere.yaml", "does not exist")),
    "missing-checkpoint": Case(("fit", *BASE, "--ckpt_path", "{run}/checkpoints/gone.ckpt"), ("gone.ckpt",)),
    "checkpoint-of-another-model": Case(
        ("fit", *BASE, "--ckpt_path", "{run}/checkpoints/last.ckpt"),
        ("last.ckpt", "another model", "(32, 64)", "config.yaml"),
    ),
    "legacy-weights-with-extra-keys": Case(
        ("fit", *BASE, "--model.init_args.weights", "{tmp}/legacy_ddp.pt"), ("legacy_ddp.pt", "unexpected", "extra")
    ),
    "local-rank-disagrees": Case(
        ("fit", *BASE, "--local_rank=0"), ("--local_rank=0", "LOCAL_RANK=1"), {"LOCAL_RANK": "1"}
    ),
    "world-size-disagrees-with-torchrun": Case(
        ("fit", *BASE, "--config", CPU_DDP), ("parallel.devices=2", "torchrun", "4"), torchrun_env(4, 4)
    ),
    "world-size-not-devices-times-nodes": Case(
        ("fit", *BASE, "--config", CPU_DDP), ("world size 2", "WORLD_SIZE=3"), torchrun_env(3, 2)
    ),
    "unknown-config-key": Case(("fit", *BASE, "--parallel.gpus", "2"), ("unknown option 'gpus' in parallel",)),
    # Issue 11: code that is not the template's, and files that are not checkpoints.
    "checkpoint-is-a-text-file": Case(
        ("test", *BASE, "--ckpt_path", "{tmp}/notes.txt"), ("notes.txt", "not a file written by torch.save")
    ),
    "checkpoint-is-a-csv-file": Case(
        ("test", *BASE, "--ckpt_path", "{tmp}/predictions.csv"), ("predictions.csv", "starts with 'inde'")
    ),
    "checkpoint-is-a-folder": Case(("test", *BASE, "--ckpt_path", "{run}"), ("version_0", "is a folder")),
    "text-checkpoint-with-pickle-allowed": Case(
        ("test", *BASE, "--ckpt_path", "{tmp}/notes.txt"),
        ("notes.txt", "not a file written by torch.save"),
        {"PROJECT_ALLOW_PICKLE": "1"},
        absent=("PROJECT_ALLOW_PICKLE",),
    ),
    "test-without-a-checkpoint": Case(("test", *BASE), ("without --ckpt_path", "--ckpt_path none")),
    "predict-without-a-checkpoint": Case(("predict", *BASE), ("without --ckpt_path", "--ckpt_path none")),
    "batch-larger-than-the-dataset": Case(
        ("fit", *BASE, "--data.init_args.batch_size", "100000"), ("1257 samples", "one global batch of 100000")
    ),
    "accumulation-does-not-divide": Case(
        ("fit", *BASE, "--parallel.global_batch_size", "100", "--parallel.accumulation", "3"),
        ("global_batch_size=100", "accumulation 3", "99 or 102"),
    ),
    "refused-in-a-forked-rank": Case(
        ("fit", *BASE, "--config", FORK, "--data.init_args.batch_size", "100000"), ("1257 samples", "2 processes")
    ),
    "monitored-metric-never-logged": Case(
        ("fit", *BASE, "--config", "{tmp}/model_attribute.yaml"),
        ("BestCheckpoint(monitor='val/acc')", "never logs 'val/acc'", "val/loss"),
    ),
    "network-attribute-missing": Case(
        ("fit", *BASE, "--config", "{tmp}/net_attribute.yaml"), ("net_attribute='body'", "net")
    ),
    "export-would-rebuild-another-network": Case(
        ("fit", *BASE, "--model.init_args.net.class_path", "user_code.MisdescribedNet"),
        ("user_code.MisdescribedNet", "another network"),
    ),
    # Issue 16: the precision the plan owns.
    "precision-16-mixed-on-cpu": Case(
        ("fit", *BASE, "--parallel.precision", "16-mixed"), ("precision='16-mixed'", "needs GPUs", "bf16-mixed")
    ),
    # Issue 23: nothing a user trained is lost, every mistake one line.
    "log-folder-not-writable": Case(
        ("fit", *BASE, "--trainer.logger.init_args.save_dir", "{tmp}/notes.txt/logs"),
        ("cannot create the run directory", "notes.txt/logs", "save_dir"),
    ),
    "a-new-run-into-a-folder-holding-one": Case(
        ("fit", *BASE, "--trainer.logger.init_args.version", "version_0"),
        ("logs/digits/version_0 already holds a run", "--resume auto"),
    ),
    "a-stray-rank-in-the-environment": Case(("fit", *BASE), ("RANK=1", "no launcher", "unset RANK"), env={"RANK": "1"}),
    "cpu-threads-below-one": Case(("fit", *BASE, "--parallel.cpu_threads", "0"), ("parallel.cpu_threads=0", ">= 1")),
    "trainer-precision-beside-the-parallel-section": Case(
        ("fit", *BASE, "--trainer.precision", "bf16-mixed"), ("trainer.precision='bf16-mixed'", "parallel")
    ),
    # Issue 39: bad input that gave tracebacks, raw parser pages or misleading hints.
    "checkpoint-is-a-symlink-loop": Case(("test", *BASE, "--ckpt_path", "{tmp}/loop.ckpt"), ("loop.ckpt", "a loop")),
    "run-name-is-a-path": Case(
        ("fit", *BASE, "--trainer.logger.init_args.name", "../../escaped"),
        ("run name '../../escaped'", "plain folder name", "give a plain name"),
        outside=("../escaped", "escaped"),
    ),
    "run-version-is-a-path": Case(
        ("fit", *BASE, "--trainer.logger.init_args.version", "../version_9"), ("run version '../version_9'",)
    ),
    "micro-batch-not-a-number": Case(
        ("fit", *BASE, "--parallel.micro_batch", "abc"),
        ("parallel.micro_batch='abc' is not a whole number, 'auto' or null",),
        absent=("Parser key", "Union"),
    ),
    "save-dir-url-without-a-bucket": Case(
        ("fit", *BASE, "--trainer.logger.init_args.save_dir", "s3://"),
        ("save_dir 's3://' names no bucket or location after s3:// (an unset variable?)", "s3://bucket/prefix"),
        outside=("s3:",),
    ),
    "a-list-given-as-one-word": Case(
        ("fit", *BASE, "--parallel.stop_signals", "SIGTERM"),
        ("parallel.stop_signals='SIGTERM' is not a list ([a, b]); give parallel.stop_signals a list ([a, b])",),
    ),
    # Issue 35: each strategy's options moved into its subsection; an old flat name says its new one.
    "old-flat-name-on-the-command-line": Case(
        ("fit", *BASE, "--parallel.find_unused_parameters", "true"),
        ("parallel.find_unused_parameters is now parallel.ddp.find_unused_parameters", "write --parallel.ddp."),
        absent=("unknown option",),
    ),
    "old-flat-name-in-a-config-file": Case(
        ("fit", *BASE, "--config", "{tmp}/old_names.yaml"),
        ("parallel.broadcast_buffers is now parallel.ddp.broadcast_buffers", "`broadcast_buffers:` under `ddp:`"),
        absent=("unknown option",),
    ),
    "unknown-subsection-option-on-the-command-line": Case(
        ("fit", *BASE, "--parallel.ddp.shards", "2"), ("unknown option 'shards' in parallel.ddp",)
    ),
    # Issue 44: the user's own class path that does not import says which module failed and why.
    "own-class-name-typo": Case(
        ("fit", *OWN, "--model", "waves1d.WaveModul"),
        ("--model waves1d.WaveModul: module waves1d (waves1d.py) has no class WaveModul", "did you mean WaveModule"),
        absent=("is not LightningModule", "--help"),
    ),
    "own-module-not-on-the-path": Case(
        ("fit", *OWN, "--model", "nowhere1d.WaveModule"),
        ("cannot import module nowhere1d (No module named 'nowhere1d')", "the folder that holds nowhere1d/"),
    ),
    "own-module-missing-a-dependency": Case(
        ("fit", *OWN, "--model", "waves1d.WaveModule", "--data", "needs_dep.WaveData"),
        ("--data needs_dep.WaveData: module needs_dep", "No module named 'not_installed_dep'", "(needs_dep.py:1)"),
    ),
    "own-module-syntax-error": Case(
        ("fit", *OWN, "--model", "broken_syntax.WaveModule"),
        ("module broken_syntax has a syntax error", "(broken_syntax.py:2)"),
    ),
    "own-module-raises-in-a-config-file": Case(
        ("fit", *OWN, "--config", "{tmp}/own_model.yaml"),
        ("model class_path raises_inside.WaveModule (in", "own_model.yaml)", "ValueError: bad setting"),
        absent=("is not LightningModule",),
    ),
    "own-callback-does-not-import": Case(
        ("fit", *OWN, "--model", "waves1d.WaveModule", "--config", "{tmp}/own_callback.yaml"),
        ("trainer.callbacks class_path waves1d.WaveCallback", "module waves1d (waves1d.py) has no class WaveCallback"),
        absent=("is not Callback",),
    ),
}


def layer_cases() -> tuple[dict[str, Case], dict[str, str]]:
    """Each installed layer's bad inputs (``tests/extras/<layer>/bad_input.py``: ``CASES`` and the ``FILES`` they read).

    Found on disk, as the core finds the layers: a stripped layer's cases go with it.
    """
    cases: dict[str, Case] = {}
    files: dict[str, str] = {}
    for path in sorted((Path(__file__).resolve().parents[1] / "extras").glob("*/bad_input.py")):
        spec = importlib.util.spec_from_file_location(f"bad_input_{path.parent.name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cases.update({name: Case(**fields) for name, fields in module.CASES.items()})
        files.update(getattr(module, "FILES", {}))
    return cases, files


LAYER_CASES, LAYER_FILES = layer_cases()
CASES.update(LAYER_CASES)
# Config files for the cases above: a module that logs no val/acc; a net_attribute that does not exist.
MODEL_ATTRIBUTE_YAML = """model:
  class_path: user_code.ModelAttributeClassifier
  init_args:
    model: {class_path: torch.nn.Linear, init_args: {in_features: 64, out_features: 10}}
"""
NET_ATTRIBUTE_YAML = """trainer:
  callbacks:
    - class_path: project.callbacks.UnwrapEvalCallback
      init_args:
        net_attribute: body
"""

# The user's own modules in the case's folder (first on sys.path): one defines WaveModule, the others fail to import.
USER_MODULES = {
    "waves1d.py": "import lightning.pytorch as pl\n\n\nclass WaveModule(pl.LightningModule):\n    pass\n",
    "needs_dep.py": "import not_installed_dep\n",
    "broken_syntax.py": "import torch\ndef f(:\n    pass\n",
    "raises_inside.py": "import torch\nraise ValueError('bad setting')\n",
    "own_model.yaml": "model:\n  class_path: raises_inside.WaveModule\n",
    "own_callback.yaml": "trainer:\n  callbacks:\n    - class_path: waves1d.WaveCallback\n",
}


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A folder holding a short finished run (hidden=32, so its checkpoint is of another model than the config's)."""
    cwd = tmp_path_factory.mktemp("finished")
    args = ["fit", *BASE, "--model.init_args.net.init_args.hidden", "32", "--trainer.max_steps", "2"]
    args += ["--trainer.limit_val_batches", "1", "--test_after_fit", "false"]
    result = run_cli(args, cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in run_dirs(cwd)] == ["version_0"]
    return cwd


def run_case(name: str, case: Case, template: Path, root: Path) -> dict:
    """Run one case in a copy of the finished run's folder; return what the test checks."""
    cwd = root / name
    shutil.copytree(template, cwd)  # copy2: the copy keeps the files' times, so any touch shows
    (cwd / "broken.yaml").write_text("trainer:\n  max_epochs: [1\n")
    (cwd / "notes.txt").write_text("these are not weights\n")
    (cwd / "predictions.csv").write_text("index,prediction\n0,3\n")
    (cwd / "net_attribute.yaml").write_text(NET_ATTRIBUTE_YAML)
    (cwd / "model_attribute.yaml").write_text(MODEL_ATTRIBUTE_YAML)
    (cwd / "old_names.yaml").write_text("parallel:\n  scenario: cpu\n  broadcast_buffers: false\n")
    for file, text in {**USER_MODULES, **LAYER_FILES}.items():  # a layer's files, in folders of their own too
        (cwd / file).parent.mkdir(parents=True, exist_ok=True)
        (cwd / file).write_text(text)
    (cwd / "loop.ckpt").symlink_to(cwd / "loop.ckpt")
    legacy = {f"module.{k}": v for k, v in DigitsNet().state_dict().items()}
    torch.save({**legacy, "module.extra.weight": torch.zeros(3)}, cwd / "legacy_ddp.pt")
    before = snapshot(cwd / "logs")
    args = [a.format(run=str(cwd / RUN), tmp=str(cwd)) for a in case.args]
    start = time.monotonic()
    result = run_cli(args, cwd, env=case.env, timeout=120)
    escaped = [path for path in case.outside if (cwd / path).exists()]
    after = snapshot(cwd / "logs")
    return {"result": result, "seconds": time.monotonic() - start, "before": before, "after": after, "escaped": escaped}


@pytest.fixture(scope="module")
def outcomes(finished_run, tmp_path_factory) -> dict[str, dict]:
    """All cases, two at a time."""
    root = tmp_path_factory.mktemp("cases")
    calls = [partial(run_case, name, case, finished_run, root) for name, case in CASES.items()]
    return dict(zip(CASES, two_at_a_time(*calls), strict=True))


# The first case's test pays for the module's fixture: every case, two at a time (a few minutes on 2 cores).
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_clear_line_and_touches_nothing(outcomes, name):
    outcome, case = outcomes[name], CASES[name]
    result = outcome["result"]
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert outcome["seconds"] < SECONDS, f"took {outcome['seconds']:.0f} s"
    assert "Traceback" not in output, output
    errors = [line for line in result.stderr.splitlines() if re.match(r"(\[rank \d+\] )?error: ", line)]
    assert len(errors) == 1, result.stderr
    for needle in case.needles:
        assert needle in errors[0], f"{needle!r} not in: {errors[0]}"
    for word in case.absent:
        assert word not in errors[0], f"{word!r} in: {errors[0]}"
    assert outcome["after"] == outcome["before"], "the existing run directory changed or a new version appeared"
    assert outcome["escaped"] == [], f"written outside logs/: {outcome['escaped']}"


@pytest.mark.distributed
def test_a_rendezvous_port_in_use_is_named_not_blamed_on_a_rank(tmp_path):
    """MASTER_PORT taken by another process: one line naming the port, exit 2, no run directory left."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(["fit", *BASE, "--config", CPU_DDP], tmp_path, env={"MASTER_PORT": str(port)})
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"MASTER_PORT={port} is already in use" in errors[0], result.stderr[-3000:]
    assert "died" not in errors[0]
    assert not (tmp_path / "logs" / "digits").exists() or not run_dirs(tmp_path)
