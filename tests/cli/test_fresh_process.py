"""What a fresh interpreter imports: the digits without scikit-learn (an export: tests/extras/export/cli/).

Each test starts one ``python -c`` (a process that has imported nothing yet), so they live in the cli lane.
"""

from __future__ import annotations

import subprocess
import sys

import torch


def test_digits_are_read_exactly_as_scikit_learn_loads_them_without_importing_it():
    from sklearn.datasets import load_digits

    from project.data.arrays import load_digits_tensors

    x, y = load_digits_tensors()
    bunch = load_digits()
    assert torch.equal(x, torch.tensor(bunch.data, dtype=torch.float32) / 16.0)
    assert torch.equal(y, torch.tensor(bunch.target, dtype=torch.int64))
    code = "import sys; from project.data import arrays; arrays.load_digits_tensors(); print('sklearn' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
