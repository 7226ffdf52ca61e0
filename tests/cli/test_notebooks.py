"""The notebooks run top to bottom on a CPU, headless, and are committed without outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import CONFIGS, REPO, cli_env, read_plan

NOTEBOOKS = REPO / "notebooks"
QUICKSTART = NOTEBOOKS / "01_quickstart.ipynb"
PARALLEL = NOTEBOOKS / "02_parallel_scenarios.ipynb"
STRIP = REPO / "scripts" / "strip_notebooks.py"
# The bound for one notebook, start to end (pytest-timeout); nbclient also stops a single cell there.
NOTEBOOK_SECONDS = 180


@pytest.fixture
def run_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Execute a notebook top to bottom with this interpreter's kernel; return it with its outputs.

    The kernel is the test's own interpreter (the venv's) whatever `python3` kernelspec the machine has:
    a kernelspec written into ``tmp_path`` comes first on JUPYTER_PATH. TMPDIR points into ``tmp_path``,
    so the notebook's temporary working folder, and every run it makes, goes away with it.
    """
    kernel_dir = tmp_path / "jupyter" / "kernels" / "python3"
    kernel_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "language": "python"}
    (kernel_dir / "kernel.json").write_text(json.dumps({**spec, "display_name": "Python 3 (tests)"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))  # read by the kernel manager, in this process

    def run(path: Path) -> nbformat.NotebookNode:
        notebook = nbformat.read(path, as_version=4)
        client = NotebookClient(
            notebook,
            kernel_name="python3",
            timeout=NOTEBOOK_SECONDS,
            resources={"metadata": {"path": str(NOTEBOOKS)}},
        )
        # MPLBACKEND=agg: nothing can reach a display even before a notebook's `%matplotlib inline`.
        client.execute(env=cli_env({"TMPDIR": str(tmp_path), "MPLBACKEND": "agg"}))
        assert not (NOTEBOOKS / "logs").exists(), "a notebook wrote its runs into the repository"
        return notebook

    return run


def outputs_of(notebook: nbformat.NotebookNode, tag: str | None = None) -> list[nbformat.NotebookNode]:
    """The outputs of every code cell, or of the cells tagged ``tag``."""
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    if tag is not None:
        cells = [c for c in cells if tag in c.metadata.get("tags", [])]
        assert cells, f"no cell is tagged {tag!r}"
    return [output for cell in cells for output in cell.outputs]


def images(outputs: list[nbformat.NotebookNode]) -> int:
    return sum("image/png" in output.get("data", {}) for output in outputs)


def markdown(outputs: list[nbformat.NotebookNode]) -> str:
    return "\n".join(output.get("data", {}).get("text/markdown", "") for output in outputs)


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_committed_notebooks_carry_no_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {number} has outputs: run scripts/strip_notebooks.py"
            assert cell.execution_count is None, f"{path.name} cell {number} has an execution count"
    check = subprocess.run([sys.executable, str(STRIP), "--check", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_strip_script_removes_outputs(tmp_path: Path) -> None:
    dirty = nbformat.read(QUICKSTART, as_version=4)
    code = next(c for c in dirty.cells if c.cell_type == "code")
    code.execution_count = 3
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    code.metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    path = tmp_path / "dirty.ipynb"
    nbformat.write(dirty, path)

    def strip(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(STRIP), *args, str(path)], capture_output=True, text=True)

    check = strip("--check")
    assert (check.returncode, check.stdout.strip()) == (1, f"{path}: carries outputs or execution counts")
    assert nbformat.read(path, as_version=4) == dirty  # --check changes nothing
    assert strip().returncode == 1  # stripped now; pre-commit's "files were modified"
    assert strip("--check").returncode == 0
    # Stripping an executed copy gives back the committed file, byte for byte.
    assert path.read_text() == QUICKSTART.read_text()


@pytest.mark.timeout(NOTEBOOK_SECONDS)
def test_quickstart_runs_headless(run_notebook, tmp_path: Path) -> None:
    notebook = run_notebook(QUICKSTART)
    assert images(outputs_of(notebook)) >= 2  # curves, digit grid, confusion matrix
    # The run went to the temporary folder, complete with its export.
    exports = list(tmp_path.glob("quickstart-*/logs/digits/version_0/export/model.pt"))
    assert len(exports) == 1, sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))


@pytest.mark.distributed
@pytest.mark.timeout(NOTEBOOK_SECONDS)
def test_parallel_scenarios_runs_headless(run_notebook, tmp_path: Path) -> None:
    notebook = run_notebook(PARALLEL)
    configs = sorted(p.name for p in (CONFIGS / "parallel").glob("*.yaml"))
    table = markdown(outputs_of(notebook, "scenario-table"))
    plans = markdown(outputs_of(notebook, "plans"))
    for name in configs:
        assert name in table, f"{name} missing from the scenario table"
        assert name in plans, f"{name} has no plan"
    assert plans.count('"world_size"') >= len(configs)
    assert images(outputs_of(notebook, "overlay-plot")) >= 1
    runs = sorted(tmp_path.glob("parallel-*/logs/digits/version_*"))
    assert sorted(read_plan(run)["world_size"] for run in runs) == [1, 2]
