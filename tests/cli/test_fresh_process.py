"""What a fresh interpreter imports: the digits without scikit-learn, a rebuilt export without Lightning.

Each test starts one ``python -c`` (a process that has imported nothing yet), so they live in the cli lane.
"""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

from project.export import export_network, rebuild
from project.models.digits_net import DigitsNet

from helpers import cli_env


def test_digits_are_read_exactly_as_scikit_learn_loads_them_without_importing_it():
    from sklearn.datasets import load_digits

    from project.data.arrays import load_digits_tensors

    x, y = load_digits_tensors()
    bunch = load_digits()
    assert torch.equal(x, torch.tensor(bunch.data, dtype=torch.float32) / 16.0)
    assert torch.equal(y, torch.tensor(bunch.target, dtype=torch.int64))
    code = "import sys; from project.data import arrays; arrays.load_digits_tensors(); print('sklearn' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_export_round_trip_in_a_process_without_lightning(tmp_path):
    net = DigitsNet(hidden=24, dropout=0.0).eval()
    export_network(nn.DataParallel(net), tmp_path / "export")
    state = torch.load(tmp_path / "export" / "model.pt", weights_only=True)
    assert not any(k.startswith("module.") for k in state)
    assert torch.equal(rebuild(tmp_path / "export").layers[0].weight, net.layers[0].weight)
    x = torch.rand(5, 64)
    torch.save(x, tmp_path / "x.pt")
    code = (
        "import sys, torch\n"
        "from project.export import rebuild\n"
        f"net = rebuild({str(tmp_path / 'export')!r})\n"
        f"print(net(torch.load({str(tmp_path / 'x.pt')!r})).argmax(1).tolist())\n"
        "assert 'lightning' not in sys.modules and 'pytorch_lightning' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), check=True)
    assert out.stdout.strip() == str(net(x).argmax(1).tolist())
