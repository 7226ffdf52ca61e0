"""Issue 34: a module that builds its layers in ``configure_model`` (Lightning's hook for large models and meta-device
init under FSDP) fits, is killed, resumes, tests and predicts under ddp and fsdp (2 CPU processes each).

The checkpoint check compares with the model *after* ``configure_model``: before it, such a module has no layers,
and every checkpoint of it looked like "another model". The module and its config are a user's, written here
(``tests/user_lightning_shapes.py``), not the template's classes.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS, assert_clean_error, has_layer, run_cli

RUN = Path("logs/lazy/version_0")
LAYOUTS = {"ddp": CONFIGS / "parallel" / "cpu_ddp.yaml", "fsdp": CONFIGS / "sharding" / "cpu_fsdp.yaml"}
#: fsdp is the sharding layer's: without it, ddp alone.
PRESENT = [name for name in sorted(LAYOUTS) if name != "fsdp" or has_layer("sharding")]

# What a user writes for a module of their own: no template class but the last.ckpt saver (every 10 steps here, so
# the kill point is known in advance).
USER_CONFIG = """
seed_everything: 3
model:
  class_path: user_lightning_shapes.LazyClassifier
  init_args: {hidden: 32, lr: 0.05}
data:
  class_path: user_code.PlainDigits
  init_args: {bs: 16}
trainer:
  max_epochs: 1
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {save_dir: logs, name: lazy}
  callbacks:
    - class_path: project.callbacks.TimedCheckpoint
      init_args: {every_s: null, every_n_steps: 10}
"""


def _kill_at(step: int) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": "faults.KillAtStep", "init_args": {"step": step}})


def _fit_args(tmp_path: Path, layout: str, *extra: str) -> list[str]:
    config = tmp_path / "lazy.yaml"
    config.write_text(USER_CONFIG)
    return ["--config", str(config), "--config", str(LAYOUTS[layout]), *extra]


def _step_of(path: Path) -> int:
    """The global step of last.ckpt, a file (ddp) or a sharded folder (fsdp: its meta.pt)."""
    file = path / "meta.pt" if path.is_dir() else path
    return int(torch.load(file, map_location="cpu", weights_only=True)["global_step"])


@pytest.mark.distributed
@pytest.mark.parametrize("layout", PRESENT)
def test_configure_model_module_is_killed_resumes_tests_and_predicts(tmp_path, layout):
    killed = run_cli(["fit", *_fit_args(tmp_path, layout), _kill_at(25)], tmp_path)
    assert killed.returncode != 0, killed.stdout[-2000:] + killed.stderr[-2000:]
    last = tmp_path / RUN / "checkpoints" / "last.ckpt"
    assert _step_of(last) == 20

    resumed = run_cli(["fit", *_fit_args(tmp_path, layout), "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"Resuming from {RUN}/checkpoints/last.ckpt (epoch 0, step 20)" in resumed.stderr
    assert "another model" not in resumed.stderr
    steps = _step_of(last)
    assert steps > 20  # the epoch ran to its end from the resumed step

    for command in ("test", "predict"):
        result = run_cli([command, *_fit_args(tmp_path, layout), "--ckpt_path", "last"], tmp_path)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        assert "another model" not in result.stderr
    test_run = tmp_path / "logs" / "lazy" / "version_1"
    assert (test_run / "plan.json").is_file()
    if has_layer("predictions"):
        predictions = tmp_path / "logs" / "lazy" / "version_2" / "predictions.csv"
        rows = list(csv.reader(predictions.open()))
        assert len(rows) - 1 == 45  # the 45 test digits, each once, under either layout


@pytest.mark.distributed
def test_configure_model_checkpoint_of_another_size_is_one_line_after_configure_model(tmp_path):
    fitted = run_cli(["fit", *_fit_args(tmp_path, "ddp", "--trainer.max_steps", "10")], tmp_path)
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    other = run_cli(
        ["test", *_fit_args(tmp_path, "ddp", "--model.init_args.hidden", "16"), "--ckpt_path", "last"], tmp_path
    )
    assert_clean_error(
        other, "is a checkpoint of another model than the config builds", "net.1.weight (32, 64) vs (16, 64)"
    )
    assert sorted(p.name for p in (tmp_path / "logs" / "lazy").iterdir()) == ["version_0"]  # the refusal left nothing
