"""unwrap(), importing raw DP/DDP/Lightning weights, export and rebuild without Lightning."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from project.errors import UserError
from project.export import load_weights
from project.models.digits_net import DigitsNet
from project.parallel.ddp import unwrap


def test_unwrap_strips_every_wrapper_however_deep():
    net = DigitsNet()
    wrapped = nn.DataParallel(torch.compile(nn.DataParallel(net)))
    assert unwrap(wrapped) is net
    assert unwrap(net) is net


def test_dataparallel_state_dict_loads(tmp_path):
    source = DigitsNet(hidden=16)
    torch.save(nn.DataParallel(source).state_dict(), tmp_path / "dp.pt")
    assert all(k.startswith("module.") for k in torch.load(tmp_path / "dp.pt"))
    target = DigitsNet(hidden=16)
    load_weights(target, tmp_path / "dp.pt")
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value)


def test_lightning_checkpoint_loads(tmp_path):
    source = DigitsNet(hidden=16)
    ckpt = {"state_dict": {f"net.{k}": v for k, v in source.state_dict().items()}, "epoch": 3}
    torch.save(ckpt, tmp_path / "model.ckpt")
    target = DigitsNet(hidden=16)
    load_weights(target, tmp_path / "model.ckpt")
    assert torch.equal(target.layers[0].weight, source.layers[0].weight)


def test_mismatch_lists_missing_and_unexpected_keys(tmp_path):
    torch.save({**DigitsNet(hidden=16).state_dict(), "extra.weight": torch.zeros(1)}, tmp_path / "extra.pt")
    with pytest.raises(UserError, match=r"unexpected keys \['extra.weight'\]"):
        load_weights(DigitsNet(hidden=16), tmp_path / "extra.pt")
    torch.save(DigitsNet(hidden=16, batch_norm=False).state_dict(), tmp_path / "nobn.pt")
    with pytest.raises(UserError, match=r"missing keys \['layers.1.bias'"):
        load_weights(DigitsNet(hidden=16), tmp_path / "nobn.pt")
    torch.save(DigitsNet(hidden=32).state_dict(), tmp_path / "wide.pt")
    with pytest.raises(UserError, match="shape mismatch"):
        load_weights(DigitsNet(hidden=16), tmp_path / "wide.pt")
