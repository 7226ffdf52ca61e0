"""The character-level GPT from the command line: a tiny fit, predict's generated text, the export without Lightning."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from helpers import CONFIGS, assert_clean_error, cli_env, read_scalars, run_cli, run_dirs, two_at_a_time

CHARGPT = str(CONFIGS / "gpt" / "chargpt.yaml")
NET = "--model.init_args.net.init_args."
#: configs/gpt/chargpt.yaml shrunk to seconds: a 1-layer GPT 16 wide over windows of 16, 6 steps, 4 validation windows.
TINY = [
    "--config", CHARGPT,
    f"{NET}n_layer", "1", f"{NET}n_head", "2", f"{NET}n_embd", "16", f"{NET}block_size", "16",
    "--data.init_args.block_size", "16", "--data.init_args.batch_size", "8", "--data.init_args.val_windows", "4",
    "--model.init_args.generate_chars", "24",
    "--trainer.max_steps", "6", "--trainer.val_check_interval", "3", "--trainer.log_every_n_steps", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> Path:
    """A tiny fit of configs/gpt/chargpt.yaml: its run directory."""
    cwd = tmp_path_factory.mktemp("chargpt")
    result = run_cli(["fit", *TINY], cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run,) = run_dirs(cwd, "chargpt")
    return run


def test_fit_logs_loss_validation_and_tokens_per_second(fitted):
    scalars = read_scalars(fitted)
    assert [step for step, _ in scalars["train/loss"]] == [1, 3, 5]
    assert len(scalars["val/loss"]) == 2 and all(2.0 < value < 6.0 for _, value in scalars["val/loss"])
    assert all(value > 0 for _, value in scalars["train/tokens_per_s"])
    spec = json.loads((fitted / "export" / "model.json").read_text())
    assert spec["class_path"] == "project.extras.gpt.gpt.GPT" and len(spec["init_args"]["vocab"]) > 90


def test_predict_writes_the_continuations_and_the_export_writes_them_again_without_lightning(fitted):
    (best,) = (fitted / "checkpoints").glob("best-*.ckpt")  # the weights export/ holds
    cwd = fitted.parents[2]
    result = run_cli(["predict", *TINY, "--ckpt_path", str(best)], cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((run_dirs(cwd, "chargpt")[-1] / "predictions.csv").open(newline="")))
    assert [row["prompt"] for row in rows] == ["The ", "A class ", "\n"]
    assert all(len(row["completion"]) == 24 for row in rows)
    code = (
        "import json, sys\n"
        "from project.extras.export.weights import rebuild\n"
        "from project.extras.gpt.generate import complete\n"
        f"net = rebuild({str(fitted / 'export')!r})\n"
        "texts = [complete(net, p, 24, temperature=0.8, seed=0) for p in json.loads(sys.argv[1])]\n"
        "assert not any(m.startswith(('lightning', 'pytorch_lightning')) for m in sys.modules)\n"
        "assert 'pydoc_data.topics' not in sys.modules  # the vocabulary came with the export\n"
        "print(json.dumps(texts))\n"
    )
    prompts = json.dumps([row["prompt"] for row in rows])
    out = subprocess.run(
        [sys.executable, "-c", code, prompts], capture_output=True, text=True, env=cli_env(), check=True
    )
    assert json.loads(out.stdout) == [row["completion"] for row in rows]


def test_data_the_network_cannot_read_is_one_line(tmp_path):
    runs = {"block": [*TINY, f"{NET}block_size", "8"], "vocab": [*TINY, f"{NET}vocab", "abc"]}
    for name in runs:
        (tmp_path / name).mkdir()
    results = two_at_a_time(*(partial(run_cli, ["fit", *args], tmp_path / name) for name, args in runs.items()))
    assert_clean_error(results[0], "block_size=16", "block_size=8")
    assert_clean_error(results[1], "vocabulary")
    assert not any((tmp_path / name / "logs").exists() for name in runs)  # refused before the first step
