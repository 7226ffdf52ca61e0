"""Issue 34: plain Lightning code written from scratch, run through the template (``tests/user_lightning_shapes.py``).

- A monitor on one of several validation loaders (``val/mse/dataloader_idx_0``, Lightning's own naming) is proven by
  the sanity check, as plain Lightning's ModelCheckpoint accepts it; a loader that does not exist is still one line.
- The final step of a fit is always in ``last.ckpt``; a fit whose validation never ran says so in one line.
- Lightning's own layout flags without a ``parallel:`` section say, in one line, that the guarantees are off.
- ``plan`` runs no ``prepare_data`` (a download writes files): it writes nothing, and says what it could not know;
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers import DIGITS, FAST, assert_clean_error, run_cli

TWO_LOADERS = """
model:
  class_path: user_lightning_shapes.TwoLoaderRegressor
data:
  class_path: user_lightning_shapes.TwoValLoaders
trainer:
  max_epochs: 1
  limit_train_batches: 5
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {save_dir: logs, name: two}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {monitor: MONITOR, mode: min}
"""


def _two_loaders(tmp_path: Path, monitor: str) -> list[str]:
    config = tmp_path / "two.yaml"
    config.write_text(TWO_LOADERS.replace("MONITOR", monitor))
    return ["fit", "--config", str(config)]


def test_a_monitor_on_one_of_several_validation_loaders_is_accepted_and_saves_by_it(tmp_path):
    result = run_cli(_two_loaders(tmp_path, "val/mse/dataloader_idx_1"), tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    (saved,) = (tmp_path / "logs" / "two" / "version_0" / "checkpoints").glob("*.ckpt")
    states = torch.load(saved, weights_only=True)["callbacks"]
    (state,) = (value for key, value in states.items() if key.startswith("ModelCheckpoint"))
    assert state["monitor"] == "val/mse/dataloader_idx_1" and state["best_model_score"] is not None


def test_a_monitor_on_a_validation_loader_that_does_not_exist_is_one_line(tmp_path):
    result = run_cli(_two_loaders(tmp_path, "val/mse/dataloader_idx_2"), tmp_path)
    assert_clean_error(
        result,
        "ModelCheckpoint(monitor='val/mse/dataloader_idx_2'): TwoLoaderRegressor never logs",
        "it logs val/mse/dataloader_idx_0, val/mse/dataloader_idx_1",
    )
    assert not (tmp_path / "logs" / "two").exists() or not any((tmp_path / "logs" / "two").iterdir())


def _digits(*extra: str) -> list[str]:
    return ["fit", "--config", DIGITS, "--config", FAST, "--test_after_fit", "false", *extra]


def test_max_steps_off_an_epoch_end_and_off_a_timed_save_is_in_last_ckpt(tmp_path):
    # 19 steps an epoch: step 30 is neither an epoch end nor (every_s: 60) a timed save.
    result = run_cli(_digits("--trainer.max_epochs", "5", "--trainer.max_steps", "30"), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    last = tmp_path / "logs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 30
    assert "validation never ran" not in result.stdout


def test_a_fit_whose_validation_never_ran_says_so_in_one_line(tmp_path):
    never = ("--trainer.val_check_interval", "50", "--trainer.check_val_every_n_epoch", "null")
    result = run_cli(_digits("--trainer.max_epochs", "5", "--trainer.max_steps", "30", *never), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if "validation never ran" in line]
    assert line.startswith("note: ") and "ended at step 30" in line and "val_check_interval=50" in line
    assert "BestCheckpoint(monitor='val/acc') chose nothing" in line
    last = tmp_path / "logs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 30


def test_lightnings_own_flags_without_a_parallel_section_say_the_guarantees_are_off(tmp_path):
    config = tmp_path / "lazy.yaml"
    config.write_text(OWN_CONFIG)
    flags = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    result = run_cli(["fit", "--config", str(config), *flags, "--trainer.fast_dev_run", "2"], tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    (note,) = [line for line in result.stderr.splitlines() if "no parallel: section" in line]  # rank 0 only
    assert note.startswith("note: ") and "without the template's guarantees" in note
    assert "--config configs/parallel/cpu_ddp.yaml" in note
    one = run_cli(["fit", "--config", str(config), "--trainer.fast_dev_run", "2"], tmp_path)
    assert one.returncode == 0 and "no parallel: section" not in one.stderr  # one process: nothing to say


OWN_CONFIG = """
model:
  class_path: user_lightning_shapes.LazyClassifier
data:
  class_path: user_code.PlainDigits
trainer:
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {save_dir: logs, name: lazy}
"""


def test_plan_runs_no_prepare_data_writes_nothing_and_says_what_it_could_not_know(tmp_path):
    data = ["--data.class_path", "user_lightning_shapes.WritingDigits", "--data.init_args.data_dir", "data"]
    data += ["--data.init_args.bs", "24"]
    result = run_cli(["plan", "--config", DIGITS, *data, "--json"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no data/ written, no logs/
    plan = json.loads(result.stdout.splitlines()[-1])
    assert plan["per_device_batch_size"] == 24  # the config's batch size, since the loader was not built
    (note,) = [n for n in plan["notes"] if "training loader was not built" in n]
    assert "WritingDigits.setup needs what prepare_data provides" in note and "limits" in note
    # Once fit has run prepare_data, plan builds the loader from setup alone (and still writes nothing).
    fitted = run_cli(
        ["fit", "--config", DIGITS, "--config", FAST, *data, "--trainer.max_steps", "2", "--test_after_fit", "false"],
        tmp_path,
    )
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    again = run_cli(["plan", "--config", DIGITS, *data, "--json"], tmp_path)
    assert again.returncode == 0 and sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert not [n for n in json.loads(again.stdout.splitlines()[-1])["notes"] if "not built" in n]


def test_a_monitor_typo_without_a_sanity_check_is_one_line_at_the_first_validation_and_saves(tmp_path):
    # EarlyStopping listed first, checking at each validation end (val_check_interval 0.5): ours must still speak.
    stop = {"class_path": "lightning.pytorch.callbacks.EarlyStopping", "init_args": {"monitor": "val/accuracy"}}
    early = ("--trainer.callbacks+=" + json.dumps(stop), "--trainer.num_sanity_val_steps", "0")
    result = run_cli(_digits(*early, "--trainer.val_check_interval", "0.5"), tmp_path)
    assert_clean_error(
        result,
        "training reached step 9",
        "EarlyStopping(monitor='val/accuracy'): Classifier never logs 'val/accuracy' in validation",
        "(num_sanity_val_steps=0 checked it only now); the trained state is saved in",
    )
    last = tmp_path / "logs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 9
