"""Your own LightningModule through the skeleton config (configs/own_module.yaml): its optimizer kept, its shapes
(dict batches, dict predictions, no test_step) carried through fit, resume and predict on 1 and 2 processes.
"""

from __future__ import annotations

import pytest
import torch

from helpers import CONFIGS, CPU_DDP, DIGITS, FAST, has_layer, run_cli, run_dirs, two_at_a_time

OWN = str(CONFIGS / "own_module.yaml")
NO_TEST = ["--model", "user_shapes.NoTestStepModule", "--data", "user_code.PlainDigits", "--trainer.max_epochs", "1"]
NO_TEST += ["--trainer.limit_train_batches", "10"]
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


@pytest.mark.distributed
def test_a_language_model_on_dict_batches_fits_predicts_and_resumes_on_two_processes(tmp_path):
    """Dict batches, its own optimizer, no test_step, dict predictions, an export built in __init__: 2 processes."""
    lm = ["--model", "user_shapes.TinyLM", "--data", "user_shapes.CharWindowsData", *QUIET]
    fit = run_cli(["fit", "--config", OWN, "--config", CPU_DDP, *lm, "--trainer.max_epochs", "1"], tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    (run,) = run_dirs(tmp_path, name="own")
    assert "No test after fit: TinyLM has no test_step" in fit.stdout
    steps = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]

    config = ["--config", str(run / "config.yaml")]
    predicted = run_cli(["predict", *config, "--ckpt_path", "last"], tmp_path)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    if has_layer("predictions"):
        rows = (run_dirs(tmp_path, name="own")[-1] / "predictions.csv").read_text().splitlines()
        assert rows[0] == "index,next_token,probability"
        assert [int(row.split(",")[0]) for row in rows[1:]] == list(range(100))  # each window once, in order

    resumed = run_cli(["fit", *config, "--resume", "auto", "--trainer.max_epochs", "2"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"the run continues in {run}" in resumed.stderr
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2 * steps

    # The Sequential was built in TinyLM.__init__, so no class path rebuilds it: the export holds its weights, and
    # the export layer adds a program that rebuilds without TinyLM's code.
    from user_shapes import TinyLM

    from project.export import load_weights
    from project.layers import installed

    if not any(layer.name == "export" for layer in installed()):
        return  # export/ is the export layer's
    from project.extras.export.weights import rebuild

    net = TinyLM().net
    load_weights(net, run / "export" / "model.pt")
    net = rebuild(run / "export")
    windows = torch.arange(16).reshape(2, 8) % 12  # the recorded windows' length (block 8), another batch size
    assert net(windows).shape == (2, 8, 12)
