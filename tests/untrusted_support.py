"""Untrusted files for the tests that refuse them: a checkpoint whose unpickling would run code, and the check."""

from __future__ import annotations

import os
from pathlib import Path

from project.models.digits_net import DigitsNet

from helpers import DIGITS, FAST

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
