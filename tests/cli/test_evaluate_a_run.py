"""``test --config <run>/config.yaml --ckpt_path last``: a run evaluated with its own config says only what matters."""

from __future__ import annotations

from helpers import DIGITS, FAST, run_cli, run_dirs


def test_testing_a_run_with_its_own_config_prints_no_checkpoint_callback_dirpath_warning(tmp_path):
    fit = ["fit", "--config", DIGITS, "--config", FAST, "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1"]
    trained = run_cli([*fit, "--test_after_fit", "false"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    tested = run_cli(["test", "--config", str(run / "config.yaml"), "--ckpt_path", "last"], tmp_path)
    assert tested.returncode == 0, tested.stderr[-3000:]
    # Lightning's "The dirpath has changed from ... won't be reloaded", once per checkpoint callback: a test saves none.
    assert "dirpath has changed" not in tested.stderr + tested.stdout
    assert "test/acc" in tested.stdout
