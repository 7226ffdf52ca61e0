"""A network built in the LightningModule's ``__init__`` is exported as a torch.export program (``export/model.pt2``).

It rebuilds with torch alone (no Lightning, not even the network's own code) on a batch of any size; a network
torch.export cannot capture leaves its run whole with one warning line and its state dict; a ``.pt2`` file that
``torch.export.load`` could only load by running code from it is refused.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn
from user_nets import GatedNet, SequentialClassifier

from project.errors import UserError
from project.export import load_weights
from project.extras.export.export_program import export_program, load_program
from project.extras.export.program_check import check_program_file
from project.extras.export.program_inputs import InputRecorder
from project.extras.export.weights import rebuild

from helpers import DIGITS, FAST, cli_env, read_scalars, run_cli, run_dirs, two_at_a_time

SHORT = ["--config", DIGITS, "--config", FAST, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4"]
Fit = tuple[subprocess.CompletedProcess[str], Path]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Fit]:
    """``fit`` of SequentialClassifier and of GatedClassifier, side by side: each one's output and run folder."""
    root = tmp_path_factory.mktemp("programs")

    def fit(name: str) -> Fit:
        (root / name).mkdir()
        result = run_cli(["fit", *SHORT, "--model", f"user_nets.{name}"], root / name)
        assert result.returncode == 0, result.stderr[-3000:]
        (run,) = run_dirs(root / name)
        return result, run

    names = ("SequentialClassifier", "GatedClassifier")
    return dict(zip(names, two_at_a_time(*(partial(fit, name) for name in names))))


def test_a_network_built_in_init_is_exported_as_a_program_that_rebuilds_without_lightning(runs, tmp_path):
    result, run = runs["SequentialClassifier"]
    assert "warning" not in result.stderr
    export = run / "export"
    spec = json.loads((export / "model.json").read_text())
    assert spec["format"] == "torch.export" and spec["inputs"] == ["args[0]: float32[batch, 64]"]
    assert "class_path" not in spec and spec["network"] == "torch.nn.modules.container.Sequential"

    # The trained network: the best checkpoint's weights (what test after fit evaluated), in eval mode.
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    module = SequentialClassifier()
    module.load_state_dict(torch.load(best, weights_only=True)["state_dict"])
    trained = module.net.eval()
    state = torch.load(export / "model.pt", weights_only=True)
    assert state.keys() == trained.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in trained.state_dict().items())

    # 7 samples: another batch size than the 4 recorded and the 64 trained on.
    x = torch.rand(7, 64) * 16
    torch.save(x, tmp_path / "x.pt")
    code = (
        "import sys, torch\n"
        "from project.extras.export.weights import rebuild\n"
        f"net = rebuild({str(export)!r})\n"
        f"torch.save(net(torch.load({str(tmp_path / 'x.pt')!r})), {str(tmp_path / 'y.pt')!r})\n"
        "assert not {'lightning', 'pytorch_lightning', 'user_nets'} & set(sys.modules), 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), check=True)
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "y.pt"), trained(x))


def test_a_network_torch_export_cannot_capture_keeps_its_run_and_its_state_dict(runs):
    result, run = runs["GatedClassifier"]
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    (warning,) = [line for line in output.splitlines() if line.startswith("warning:")]
    assert "no export/model.pt2: torch.export cannot capture GatedNet" in warning and "data-dependent" in warning
    assert "test/acc" in read_scalars(run) and (run / "checkpoints" / "last.ckpt").is_file()
    export = run / "export"
    assert sorted(p.name for p in export.iterdir()) == ["model.json", "model.pt"]
    assert json.loads((export / "model.json").read_text())["format"] == "state_dict"
    load_weights(GatedNet(32), export / "model.pt")
    with pytest.raises(UserError, match=r"holds the state dict model\.pt of user_nets\.GatedNet only"):
        rebuild(export)


class Branches(nn.Module):
    """Inputs in a dict and a keyword argument; outputs in a dict; BatchNorm; an op with a string argument."""

    def __init__(self) -> None:
        super().__init__()
        self.layer, self.norm = nn.Linear(4, 2), nn.BatchNorm1d(2)

    def forward(self, x: dict[str, torch.Tensor], extra: torch.Tensor) -> dict[str, torch.Tensor]:
        """Two outputs."""
        pairs = torch.einsum("bi,bj->bij", x["b"], x["b"]).sum(-1)
        return {"out": self.norm(self.layer(x["a"]) + extra), "pairs": pairs}


def _batch(n: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    return {"a": torch.rand(n, 4), "b": torch.rand(n, 3)}, torch.rand(n, 2)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    """Branches, trained a step, its inputs recorded from its first call and exported; the network and the file."""
    net = Branches()
    recorder = InputRecorder(net)
    x, extra = _batch(64)
    x["a"].requires_grad_(True)
    net(x, extra=extra)["out"].sum().backward()
    net(*_batch(32))  # a second call: not recorded
    example = recorder.example
    assert example is not None and example.batch == 4 and not net._forward_pre_hooks
    assert all(not t.requires_grad and t.device.type == "cpu" for t in (example.args[0]["a"], example.kwargs["extra"]))
    assert torch.equal(example.args[0]["a"], x["a"][:4].detach())
    file = tmp_path_factory.mktemp("program") / "model.pt2"
    export_program(net, example, file)
    return net.eval(), file


def test_the_program_takes_the_recorded_inputs_at_any_batch_size(program):
    net, file = program
    x, extra = _batch(9)
    rebuilt = load_program(file)
    got, want = rebuilt(x, extra=extra), net(x, extra=extra)
    for key in ("out", "pairs"):
        torch.testing.assert_close(got[key], want[key])


def _tampered(file: Path, out: Path, edits: dict[str, Callable[[bytes], bytes]]) -> Path:
    """An export folder whose program is ``file`` with ``edits[suffix]`` applied to the member ending in ``suffix``."""
    out.mkdir()
    (out / "model.json").write_text(json.dumps({"format": "torch.export"}))
    with zipfile.ZipFile(file) as source, zipfile.ZipFile(out / "model.pt2", "w") as target:
        for name in source.namelist():
            edit = next((fn for suffix, fn in edits.items() if name.endswith(suffix)), None)
            target.writestr(name, edit(source.read(name)) if edit else source.read(name))
    return out


class RunsCode:
    """Unpickling it touches ``marker``: what a crafted file would do with any command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def _pickled(marker: Path, obj: Callable[[RunsCode], object] = lambda x: x) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj(RunsCode(marker)), buffer)
        return buffer.getvalue()

    return edit


def _in_program(change: Callable[[dict], None]) -> dict[str, Callable[[bytes], bytes]]:
    def edit(data: bytes) -> bytes:
        program = json.loads(data)
        change(program)
        return json.dumps(program).encode()

    return {"models/model.json": edit}


def _size_expression(program: dict, text: str) -> None:
    sizes = (s for v in program["graph_module"]["graph"]["tensor_values"].values() for s in v["sizes"])
    next(s for s in sizes if "as_expr" in s)["as_expr"]["expr_str"] = text


def _pickled_weights(marker: Path) -> dict[str, Callable[[bytes], bytes]]:
    def flag(data: bytes) -> bytes:
        config = json.loads(data)["config"]
        return json.dumps({"config": {k: {**v, "use_pickle": v["path_name"] == "weight_0"} for k, v in config.items()}})

    return {"model_weights_config.json": lambda data: flag(data).encode(), "weights/weight_0": _pickled(marker)}


def _tampering(kind: str, marker: Path) -> dict[str, Callable[[bytes], bytes]]:
    """Edits of a program after which torch.export.load or ``.module()`` runs code from the file.

    Each one but the argument name does touch ``marker`` when the check is skipped (PROJECT_ALLOW_PICKLE=1, not
    tested here); the argument name goes verbatim into the Python code torch generates for the module.
    """
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    signature = lambda p: p["graph_module"]["module_call_graph"][0]["signature"]  # noqa: E731
    return {
        "the guard code": lambda: _in_program(lambda p: p.update(guards_code=[f"{code} is None"])),  # exec-ed
        "the shape expression": lambda: _in_program(lambda p: _size_expression(p, code)),  # sympify-ed: eval
        "the forward_arg_names": lambda: _in_program(lambda p: signature(p).update(forward_arg_names=[f"x={code}"])),
        "example inputs holding a pickled": lambda: {"sample_inputs/model.pt": _pickled(marker, lambda x: ((x,), {}))},
        "pickled weights": lambda: _pickled_weights(marker),  # torch.load(weights_only=False)
    }[kind]()


@pytest.mark.parametrize(
    "kind",
    [
        "the guard code",
        "the shape expression",
        "the forward_arg_names",
        "example inputs holding a pickled",
        "pickled weights",
    ],
)
def test_a_program_that_would_run_code_from_the_file_is_refused(program, tmp_path, kind):
    marker = tmp_path / "ran"
    folder = _tampered(program[1], tmp_path / "export", _tampering(kind, marker))
    with pytest.raises(UserError, match=f"holds {kind}.*PROJECT_ALLOW_PICKLE=1"):
        rebuild(folder)
    assert not marker.exists()


def test_a_program_whose_graph_calls_anything_but_an_operator_is_refused(tmp_path):
    """torch walks a node's `torch.` target with getattr and calls it when the program runs: `torch.os.system`."""
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    program = torch.export.export(net, (torch.randn(3, 8),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    good = tmp_path / "good.pt2"
    torch.export.save(program, good)
    check_program_file(good)
    bad = tmp_path / "export" / "model.pt2"
    bad.parent.mkdir()
    (bad.parent / "model.json").write_text(json.dumps({"format": "torch.export"}))
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(bad, "w") as target:
        for name in source.namelist():
            data = source.read(name)
            if name.endswith("models/model.json"):
                data = data.replace(b'"torch.ops.aten.relu.default"', b'"torch.os.system"')
            target.writestr(name, data)
    with pytest.raises(UserError, match=r"holds the call target 'torch\.os\.system'.*PROJECT_ALLOW_PICKLE=1"):
        rebuild(bad.parent)
