"""An export from outside: ``rebuild`` loads ``model.pt`` with ``weights_only=True`` and imports only trusted modules.

The checkpoints' side (``--ckpt_path``, ``--model.init_args.weights``) is tests/cli/test_untrusted_files.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from project.errors import UserError
from project.extras.export.weights import export_network, rebuild
from project.models.digits_net import DigitsNet

from faults import PickledExtra


def test_rebuild_refuses_an_export_that_needs_code(tmp_path):
    export_network(DigitsNet(hidden=8), tmp_path)
    torch.save({**DigitsNet(hidden=8).state_dict(), "extra": PickledExtra()}, tmp_path / "model.pt")
    with pytest.raises(UserError, match=r"faults\.PickledExtra.*PROJECT_ALLOW_PICKLE=1"):
        rebuild(tmp_path)


# Issue 39: a received file never chooses what is imported (importing a module runs its code).
PAYLOAD = """import pathlib
pathlib.Path({marker!r}).write_text("the payload ran")
import torch


class Net(torch.nn.Linear):
    pass
"""


def _export_naming(folder: Path, class_path: str) -> None:
    """An export of a Linear(3, 2) whose model.json names ``class_path``."""
    export_network(torch.nn.Linear(3, 2), folder, {"class_path": "torch.nn.Linear", "init_args": {}})
    spec = {"class_path": class_path, "init_args": {"in_features": 3, "out_features": 2}}
    (folder / "model.json").write_text(json.dumps(spec))


@pytest.mark.parametrize("class_path", ["payload_beside_the_export.Net", "this.Net"])
def test_an_export_naming_an_untrusted_module_is_refused_before_it_is_imported(
    tmp_path, monkeypatch, capsys, class_path
):
    """A payload module beside the export, on sys.path and in the working directory: one line, nothing imported."""
    marker = tmp_path / "marker"
    (tmp_path / "payload_beside_the_export.py").write_text(PAYLOAD.format(marker=str(marker)))
    _export_naming(tmp_path, class_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    module = class_path.rpartition(".")[0]
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(UserError) as refused:
        rebuild(tmp_path)
    message = str(refused.value)
    assert "\n" not in message
    for needle in (repr(class_path), "outside the modules it may import", f"trusted=[{module!r}]"):
        assert needle in message, message
    assert module not in sys.modules
    assert not marker.exists()
    assert "Beautiful is better than ugly" not in capsys.readouterr().out
    if module == "this":
        return
    # The caller vouches for the module: now it is imported (the refusal above is what kept the payload from running).
    assert isinstance(rebuild(tmp_path, trusted=[module]), torch.nn.Linear)
    assert marker.read_text() == "the payload ran"


def test_the_template_s_and_torch_s_networks_rebuild_without_being_named(tmp_path):
    export_network(DigitsNet(hidden=8), tmp_path / "digits")
    assert json.loads((tmp_path / "digits" / "model.json").read_text())["class_path"].startswith("project.models.")
    assert isinstance(rebuild(tmp_path / "digits"), DigitsNet)
    _export_naming(tmp_path / "linear", "torch.nn.modules.linear.Linear")
    assert isinstance(rebuild(tmp_path / "linear"), torch.nn.Linear)
    _export_naming(tmp_path / "colon", "torch.nn:Linear")  # the other import-path form: never a way around
    with pytest.raises(UserError, match=r"'torch\.nn:Linear', outside the modules it may import"):
        rebuild(tmp_path / "colon")
