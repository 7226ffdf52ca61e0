"""What a fresh interpreter imports: a rebuilt export, without Lightning.

Each test starts one ``python -c`` (a process that has imported nothing yet), so they live in the cli lane.
"""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

from project.extras.export.weights import export_network, rebuild
from project.models.digits_net import DigitsNet

from helpers import cli_env


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
        "from project.extras.export.weights import rebuild\n"
        f"net = rebuild({str(tmp_path / 'export')!r})\n"
        f"print(net(torch.load({str(tmp_path / 'x.pt')!r})).argmax(1).tolist())\n"
        "assert 'lightning' not in sys.modules and 'pytorch_lightning' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), check=True)
    assert out.stdout.strip() == str(net(x).argmax(1).tolist())
