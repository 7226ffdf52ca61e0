"""``make strip``'s rules (scripts/strip.py), on text and on a small tree: what it removes, and only that."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from helpers import REPO

spec = importlib.util.spec_from_file_location("strip", REPO / "scripts" / "strip.py")
strip = importlib.util.module_from_spec(spec)
spec.loader.exec_module(strip)


def test_marked_lines_and_blocks_go_and_the_rest_stays():
    text = (
        "keep 1\n"
        "a line about it <!-- extras:sweep -->\n"
        "<!-- extras:sweep -->\n"
        "a block\n"
        "```bash\npython -m project sweep\n```\n"
        "<!-- /extras:sweep -->\n"
        "keep 2 <!-- extras:tracking -->\n"
        "keep 3\n"
    )
    assert strip.unmark(text, "sweep") == "keep 1\nkeep 2 <!-- extras:tracking -->\nkeep 3\n"


def test_an_extra_goes_with_its_comment_and_its_neighbours_stay():
    pyproject = 'x = [\n    "a==1",\n]\n# the sweep\n# two lines\nsweep = [\n    "optuna==5.1.0",\n]\ny = [\n]\n'
    assert strip.drop_extra(pyproject, "sweep") == 'x = [\n    "a==1",\n]\ny = [\n]\n'


def test_a_layer_that_requires_a_stripped_one_goes_too_and_unknown_names_are_one_line():
    present = {"a": set(), "b": {"a"}, "c": {"b"}, "d": set()}
    assert strip.to_strip(["a"], present) == ["a", "b", "c"]
    assert strip.to_strip(["all"], present) == ["a", "b", "c", "d"]
    with pytest.raises(SystemExit, match=r"zz is not a layer of this checkout; the layers are: a, b, c, d"):
        strip.to_strip(["zz"], present)


def test_strip_removes_the_layers_folders_and_nothing_else(tmp_path: Path):
    for path in ("project/extras/x/layer.py", "tests/extras/x/unit/test_x.py", "configs/x/a.yaml", "keep/me.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("LAYER = Layer(name='x', adds='', requires=())\n")
    (tmp_path / "docs" / "extras").mkdir(parents=True)
    (tmp_path / "docs" / "extras" / "x.md").write_text("# x\n")
    (tmp_path / "README.md").write_text("a\nb <!-- extras:x -->\n")
    (tmp_path / "pyproject.toml").write_text("x = [\n]\n")
    (tmp_path / "Makefile").write_text("lock: --extra dev --extra x\n")
    assert strip.layers(tmp_path) == {"x": set()}
    removed = strip.strip(["x"], tmp_path)
    assert removed == ["project/extras/x", "tests/extras/x", "docs/extras/x.md", "configs/x"]
    assert (tmp_path / "README.md").read_text() == "a\n" and (tmp_path / "keep" / "me.py").exists()
    assert (tmp_path / "pyproject.toml").read_text() == "" and "--extra x" not in (tmp_path / "Makefile").read_text()


def test_a_notebooks_cells_tagged_for_a_layer_go_and_the_others_stay():
    notebook = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": ["keep()"]},
            {"cell_type": "code", "metadata": {"tags": ["extras:export"]}, "source": ["rebuild()"]},
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    text = json.dumps(notebook, indent=1)
    assert strip.drop_cells(text, "sweep") == text
    assert [cell["source"] for cell in json.loads(strip.drop_cells(text, "export"))["cells"]] == [["keep()"]]


def test_the_core_notebooks_tag_every_cell_that_needs_a_layer():
    """A notebook cell that imports a layer is tagged for it, so a stripped checkout runs the rest."""
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            for layer in re.findall(r"project\.extras\.(\w+)", source):
                assert f"extras:{layer}" in cell.get("metadata", {}).get("tags", []), (path.name, source[:80])
