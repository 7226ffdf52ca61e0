"""Where the user's code lives, and which checkout runs (issue 44; docs/own-code.md, "Where your package lives").

- From another folder: the installed template (``make setup``, editable) with the user's package on PYTHONPATH
  trains the user's module, its run under the current folder's ``logs/``.
- A copy of the checkout run with the shared .venv imports only its own ``project``: a module or layer deleted
  from the copy is missing there, not taken from the checkout the editable install points at.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FAST, REPO, cli_env

TINY_PACKAGE = '''"""A tiny user package: a LightningModule and a LightningDataModule."""

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class TinyModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TinyData(pl.LightningDataModule):
    def _loader(self) -> DataLoader:
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()
'''


def python(args: list[str], cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The suite's interpreter (the shared .venv) in ``cwd``; PYTHONPATH only ``pythonpath``, not the checkout."""
    env = cli_env()
    env.pop("PYTHONPATH")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_template_starts_from_another_folder_with_the_package_on_pythonpath(tmp_path):
    elsewhere, parent = tmp_path / "experiments", tmp_path / "parent"
    elsewhere.mkdir()
    (parent / "mypkg").mkdir(parents=True)
    (parent / "mypkg" / "__init__.py").write_text(TINY_PACKAGE)
    if python(["-c", "import project"], elsewhere).returncode != 0:
        pytest.skip("the template is not installed (make setup installs it editable)")
    own = str(REPO / "configs" / "own_module.yaml")
    args = ["-m", "project", "fit", "--config", own, "--config", FAST, "--model", "mypkg.TinyModule"]
    result = python([*args, "--data", "mypkg.TinyData", "--trainer.max_epochs", "1"], elsewhere, parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (elsewhere / "logs" / "own" / "version_0" / "checkpoints" / "last.ckpt").is_file()


def copy_of_the_checkout(tmp_path: Path) -> Path:
    """project/ and configs/ of this checkout in a folder of their own (what ``python -m project`` needs)."""
    copy = tmp_path / "copy"
    for folder in ("project", "configs"):
        shutil.copytree(REPO / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def commands(cwd: Path) -> set[str]:
    """The commands ``python -m project --help`` lists when run in ``cwd``: ``{fit,validate,...}``."""
    result = python(["-m", "project", "--help"], cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return set(re.search(r"\{([\w,]+)\}", result.stdout).group(1).split(","))


def test_a_layer_deleted_from_a_copy_is_gone_from_the_copy_only(tmp_path):
    original = commands(REPO)
    folders = sorted(p.parent.name for p in (REPO / "project" / "extras").glob("*/layer.py"))
    layers = [name for name in folders if name in original]  # sweep, check: layers that add a command
    if not layers:
        pytest.skip("no layer that adds a command is installed")
    copy = copy_of_the_checkout(tmp_path)
    shutil.rmtree(copy / "project" / "extras" / layers[0])
    assert layers[0] not in commands(copy)
    assert layers[0] in commands(REPO)


def test_a_module_deleted_from_a_copy_is_not_imported_from_the_installed_checkout(tmp_path):
    copy = copy_of_the_checkout(tmp_path)
    (copy / "project" / "dotted.py").unlink()
    probe = "import project, project.dotted"
    result = python(["-c", probe], copy)
    assert result.returncode != 0, f"project.dotted came from elsewhere: {result.stdout}"
    assert "No module named 'project.dotted'" in result.stderr
    # The copy itself runs: its own project, found first in the working folder.
    found = python(["-c", "import project; print(project.__file__)"], copy)
    assert found.stdout.strip() == str(copy / "project" / "__init__.py")
    assert importlib.util.find_spec("project.dotted") is not None  # this checkout still has it
