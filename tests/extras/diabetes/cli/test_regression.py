"""A regression job on a plain LightningDataModule, run as a user would: fit, export, predict, test, 2 processes.

configs/diabetes/diabetes.yaml trains project.extras.diabetes.regressor.Regressor (network at ``.model``) around
project.models.mlp.MLP (no ``init_args`` attribute) on project.extras.diabetes.data.DiabetesDataModule
(an ordinary LightningDataModule with ordinary DataLoaders).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from project.extras.diabetes.arrays import diabetes_tensors

from helpers import CONFIGS, CPU_DDP, cli_env, has_layer, read_plan, read_scalars, run_cli, run_dirs

DIABETES = str(CONFIGS / "diabetes" / "diabetes.yaml")
NAME = "diabetes"
# Few epochs and a quiet console (what tests/configs/fast.yaml does for digits).
QUICK = [
    "--trainer.max_epochs",
    "3",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
]
MLP_INIT_ARGS = {"in_features": 10, "hidden": 64, "out_features": 1, "depth": 2}


def said(result: subprocess.CompletedProcess[str]) -> str:
    """What a CLI run printed, for assertion messages (stderr last: that is where errors go)."""
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-5000:]}"


@dataclass
class Run:
    """One CLI call and the run directory it made (None when it made none)."""

    cwd: Path
    result: subprocess.CompletedProcess[str]
    run: Path | None

    def need(self, *parts: str) -> Path:
        """A file of the run that a later step needs, or a failure saying why it is missing."""
        assert self.run is not None, f"no run directory under {self.cwd}/logs/{NAME}\n{said(self.result)}"
        path = self.run.joinpath(*parts)
        assert path.exists(), f"{path} missing\n{said(self.result)}"
        return path


def run_in(cwd: Path, args: list[str]) -> Run:
    """Run the CLI in ``cwd`` and pick out the run directory this call created."""
    before = set(run_dirs(cwd, NAME))
    result = run_cli(args, cwd)
    new = [run for run in run_dirs(cwd, NAME) if run not in before]
    return Run(cwd, result, new[-1] if new else None)


def read_predictions(path: Path) -> tuple[str, list[int], list[float]]:
    """Header, indices and values of a predictions.csv."""
    header, *rows = path.read_text().splitlines()
    pairs = [row.split(",") for row in rows]
    return header, [int(index) for index, _ in pairs], [float(value) for _, value in pairs]


def size_of_test_split() -> int:
    """Samples in the default test split (what predict writes one row for)."""
    return len(diabetes_tensors(0.15, 0.15, 0)[2])


@pytest.fixture(scope="module")
def fit_run(tmp_path_factory) -> Run:
    """Fit on one process, then test of the best checkpoint (the CLI's test_after_fit)."""
    cwd = tmp_path_factory.mktemp("diabetes")
    return run_in(cwd, ["fit", "--config", DIABETES, *QUICK])


@pytest.fixture(scope="module")
def predicted(fit_run) -> Run:
    """Predict on one process from the fit's last.ckpt; predictions.csv lands in a new run directory."""
    last = fit_run.need("checkpoints", "last.ckpt")
    return run_in(fit_run.cwd, ["predict", "--config", DIABETES, *QUICK, "--ckpt_path", str(last)])


def test_fit_logs_mse_and_exports_the_mlp_from_its_config(fit_run):
    assert fit_run.result.returncode == 0, said(fit_run.result)
    assert fit_run.run is not None and fit_run.run.name == "version_0", said(fit_run.result)
    scalars = read_scalars(fit_run.run)
    for tag in ("train/loss", "val/mse", "val/mae", "test/mse", "test/mae"):
        assert tag in scalars, f"{tag} not logged: {sorted(scalars)}\n{said(fit_run.result)}"
    spec = json.loads(fit_run.need("export", "model.json").read_text())
    assert fit_run.need("export", "model.pt").is_file()
    # MLP keeps no init_args of its own: the template writes the config's class_path/init_args (defaults filled).
    assert spec["class_path"] == "project.models.mlp.MLP", spec
    assert spec["init_args"] == MLP_INIT_ARGS, spec


def rebuilt_test_mse(export: Path) -> float:
    """The test MSE of the exported network, rebuilt in a plain Python process that never imports Lightning."""
    code = (
        "import sys, torch\n"
        "from project.extras.diabetes.arrays import diabetes_tensors\n"
        "from project.extras.export.weights import rebuild\n"
        f"net = rebuild({str(export)!r})\n"
        "_, _, test = diabetes_tensors(0.15, 0.15, 0)\n"
        "x, y = test.tensors\n"
        "with torch.no_grad():\n"
        "    mse = torch.nn.functional.mse_loss(net(x).squeeze(-1), y).item()\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('lightning', 'pytorch_lightning')))\n"
        "assert not loaded, loaded\n"
        "print(mse)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env())
    assert out.returncode == 0, said(out)
    return float(out.stdout.strip().splitlines()[-1])


def test_export_rebuilds_without_lightning_to_the_logged_test_mse(fit_run):
    export = fit_run.need("export", "model.json").parent
    logged = read_scalars(fit_run.run)["test/mse"][-1][1]  # test after fit: the best checkpoint, as exported
    assert rebuilt_test_mse(export) == pytest.approx(logged, rel=1e-4)


@pytest.mark.skipif(not has_layer("predictions"), reason="predictions.csv is the predictions layer's")
def test_predict_writes_one_float_per_test_sample(predicted):
    assert predicted.result.returncode == 0, said(predicted.result)
    header, indices, values = read_predictions(predicted.need("predictions.csv"))
    assert header == "index,prediction"
    assert indices == list(range(size_of_test_split()))  # 66 of 442: round(442 * 0.15) for val and test each
    assert all(math.isfinite(value) for value in values)


def test_test_from_the_runs_own_saved_config(fit_run):
    config = fit_run.need("config.yaml")
    last = fit_run.need("checkpoints", "last.ckpt")
    test = run_in(fit_run.cwd, ["test", "--config", str(config), "--ckpt_path", str(last)])
    assert test.result.returncode == 0, said(test.result)
    assert test.run is not None and "test/mse" in read_scalars(test.run), said(test.result)


@pytest.mark.distributed
def test_two_process_fit_plans_two_ranks_and_logs_test_mse(tmp_path):
    fit = run_in(tmp_path, ["fit", "--config", DIABETES, "--config", CPU_DDP, *QUICK])
    assert fit.result.returncode == 0, said(fit.result)
    assert read_plan(fit.need())["world_size"] == 2
    scalars = read_scalars(fit.need())
    assert "test/mse" in scalars, f"{sorted(scalars)}\n{said(fit.result)}"
    # The 2-process export is the bare MLP too, and rebuilds to what the 2-process test logged.
    export = fit.need("export", "model.json").parent
    assert json.loads((export / "model.json").read_text())["class_path"] == "project.models.mlp.MLP"
    assert rebuilt_test_mse(export) == pytest.approx(scalars["test/mse"][-1][1], rel=1e-4)


@pytest.mark.distributed
@pytest.mark.skipif(not has_layer("predictions"), reason="predictions.csv is the predictions layer's")
def test_two_process_predict_matches_one_process(fit_run, predicted, tmp_path):
    one = predicted.need("predictions.csv")
    last = fit_run.need("checkpoints", "last.ckpt")
    two = run_in(tmp_path, ["predict", "--config", DIABETES, "--config", CPU_DDP, *QUICK, "--ckpt_path", str(last)])
    assert two.result.returncode == 0, said(two.result)
    header, indices, values = read_predictions(two.need("predictions.csv"))
    header_1, indices_1, values_1 = read_predictions(one)
    # Same rows in the same order, each sample once. Values agree to float32 rounding only: CPU matmul
    # kernels may round a row differently in a batch of another size (per-device batches differ).
    assert (header, indices) == (header_1, indices_1)
    assert values == pytest.approx(values_1, rel=1e-5, abs=1e-6)
