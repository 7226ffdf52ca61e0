"""Files from outside load with ``weights_only=True``: one that needs arbitrary code is refused with the reason
and the opt-in (``PROJECT_ALLOW_PICKLE=1``), and its code never runs; the opt-in then loads a trusted file.

Covers both ways a file comes in through the CLI: ``--ckpt_path`` and ``--model.init_args.weights``.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from untrusted_support import OPT_IN, TEST, RunsCodeWhenUnpickled, assert_refused, checkpoint_with

from faults import PickledExtra
from helpers import read_scalars, run_cli, run_dirs, two_at_a_time


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
