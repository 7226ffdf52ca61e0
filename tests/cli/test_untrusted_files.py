"""Files from outside load with ``weights_only=True``: one that needs arbitrary code is refused with the reason
and the opt-in (``PROJECT_ALLOW_PICKLE=1``), and its code never runs; the opt-in then loads a trusted file.

Covers both ways a file comes in through the CLI: ``--ckpt_path`` and ``--model.init_args.weights``.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest
import torch

from project.models.digits_net import DigitsNet

from faults import PickledExtra
from helpers import DIGITS, FAST, read_scalars, run_cli, run_dirs, two_at_a_time

TEST = ["test", "--config", DIGITS, "--config", FAST]
OPT_IN = {"PROJECT_ALLOW_PICKLE": "1"}


class RunsCodeWhenUnpickled:
    """Unpickling this creates a folder: proof of arbitrary code execution if the folder ever appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def checkpoint_with(extra: object) -> dict:
    """A Lightning checkpoint of the model configs/digits.yaml builds, carrying ``extra`` as well."""
    net = DigitsNet(hidden=256, dropout=0.1, batch_norm=True)
    state = {f"net.{k}": v for k, v in net.state_dict().items()}
    return {"state_dict": state, "pytorch-lightning_version": "2.6.6", "extra": extra}


def assert_refused(result, path: Path, what: str) -> None:
    """Exit code 2, one line with the file, what it holds, why it is refused and the opt-in."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    for needle in (str(path), what, "weights_only=True", "PROJECT_ALLOW_PICKLE=1"):
        assert needle in line, f"{needle!r} not in {line}"


def test_a_checkpoint_that_runs_code_is_refused_and_the_code_never_runs(tmp_path):
    marker = tmp_path / "code_ran"
    path = tmp_path / "exploit.ckpt"
    torch.save(checkpoint_with(RunsCodeWhenUnpickled(marker)), path)
    result = run_cli([*TEST, "--ckpt_path", str(path)], tmp_path)
    assert_refused(result, path, "posix.mkdir")
    assert not marker.exists()
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("flag", ["--ckpt_path", "--model.init_args.weights"])
def test_a_pickled_custom_class_is_refused_unless_trusted(tmp_path, flag):
    path = tmp_path / "custom.ckpt"
    torch.save(checkpoint_with(PickledExtra()), path)
    (tmp_path / "refused").mkdir()
    (tmp_path / "trusted").mkdir()
    refused, trusted = two_at_a_time(
        partial(run_cli, [*TEST, flag, str(path)], tmp_path / "refused"),
        partial(run_cli, [*TEST, flag, str(path)], tmp_path / "trusted", env=OPT_IN),
    )
    assert_refused(refused, path, "faults.PickledExtra")
    assert not (tmp_path / "refused" / "logs").exists()

    assert trusted.returncode == 0, trusted.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "trusted")
    assert "test/acc" in read_scalars(run)
