"""Your own LightningModule through the skeleton config (configs/own_module.yaml): its optimizer kept, its shapes
(dict batches, dict predictions, no test_step) carried through fit, resume and predict on 1 and 2 processes.
"""

from __future__ import annotations

import torch

from helpers import CONFIGS, DIGITS, FAST, run_cli, run_dirs, two_at_a_time

OWN = str(CONFIGS / "own_module.yaml")
NO_TEST = ["--model", "user_shapes.NoTestStepModule", "--data", "user_code.PlainDigits", "--trainer.max_epochs", "1"]
QUIET = ["--config", FAST, "--trainer.limit_val_batches", "2"]


def test_the_skeleton_keeps_the_modules_optimizer_and_a_task_config_says_it_replaces_it(tmp_path):
    own, replaced = tmp_path / "own", tmp_path / "replaced"
    own.mkdir(), replaced.mkdir()
    kept, swapped = two_at_a_time(
        lambda: run_cli(["fit", "--config", OWN, *QUIET, *NO_TEST], own),
        lambda: run_cli(["fit", "--config", DIGITS, *QUIET, *NO_TEST], replaced),
    )
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert swapped.returncode == 0, swapped.stderr[-3000:]
    assert "note:" not in kept.stderr
    notes = [line for line in swapped.stderr.splitlines() if line.startswith("note: the config's optimizer")]
    assert len(notes) == 1 and "NoTestStepModule.configure_optimizers" in notes[0], swapped.stderr[-3000:]
    assert "will be overridden" not in swapped.stderr  # Lightning's own warning is replaced by the note

    def optimizer(cwd):
        (run,) = run_dirs(cwd, name="own" if cwd == own else "digits")
        state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["optimizer_states"][0]
        return state["param_groups"][0]

    assert "momentum" in optimizer(own) and "betas" not in optimizer(own)  # the module's SGD
    assert "betas" in optimizer(replaced)  # the config's AdamW
    assert "No test after fit: NoTestStepModule has no test_step" in kept.stdout
