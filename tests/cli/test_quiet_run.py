"""Issue 34: a first run is quiet. ``make train``'s command, in a fresh interpreter with Python's default warnings
(no ``PYTHONWARNINGS`` as the other tests set), prints no warning and no advertisement, only what the run did.

Each line that used to come was fixed at its source: Lightning's litlogger tip and torch's LeafSpec deprecation
raised inside Lightning (two targeted filters, :func:`project.run_config.quiet_third_party`), the logging interval
longer than an epoch (``configs/digits.yaml``'s ``log_every_n_steps``), and ``.test(ckpt_path="best")`` with several
ModelCheckpoints (the template names the best checkpoint's path itself).
"""

from __future__ import annotations

from helpers import CONFIGS, DIGITS, cli_env, run_cli

NOISE = ("Warning", "warning", "litlogger", "Tip:", "deprecated")


def _noise(output: str) -> list[str]:
    return [line for line in output.splitlines() if any(word in line for word in NOISE)]


def _default_warnings() -> dict[str, str]:
    env = cli_env()
    env.pop("PYTHONWARNINGS", None)  # as a user's shell has it: Python's default filters
    return env


def test_make_train_prints_no_warning_and_no_tip(tmp_path):
    # make train's command; 2 of its 20 epochs (every warning came at the start, at an epoch end or in the test)
    result = run_cli(["fit", "--config", DIGITS, "--trainer.max_epochs", "2"], tmp_path, env=_default_warnings())
    assert result.returncode == 0, result.stderr[-3000:]
    assert _noise(result.stdout + result.stderr) == []
    assert "Run directory: logs/digits/version_0" in result.stdout
    assert "Restoring states from the checkpoint path at logs/digits/version_0/checkpoints/best-" in result.stderr


def test_the_readme_plan_command_prints_no_warning(tmp_path):
    dp_012 = str(CONFIGS / "parallel" / "dp_012.yaml")
    args = ["plan", "--config", DIGITS, "--config", dp_012, "--assume_gpus", "8"]
    result = run_cli(args, tmp_path, env=_default_warnings())
    assert result.returncode == 0, result.stderr[-3000:]
    assert _noise(result.stdout + result.stderr) == []
