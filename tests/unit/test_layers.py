"""The core and its layers: the core imports no layer, each layer plugs in through its ``layer.py`` alone.

The core is ``project/`` outside ``project/extras/``. Every import counts, also one inside a function, and so does
an import path written as a string (a strategy row's ``build``, a command row's ``runner``): a core table naming a
layer would break once the layer is stripped. A layer imports the core and itself, or a layer its ``requires``
names (stripping that one strips it too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_import_contract import MODULES, ROOT, imports_of

from project.layers import EXTRAS, hook, installed

LAYER_PACKAGE = "project.extras"


def core_modules() -> dict[str, Path]:
    """The core's modules by name."""
    return {name: path for name, path in MODULES.items() if not name.startswith(LAYER_PACKAGE)}


def reaches_into_a_layer(source: str, where: Path) -> list[str]:
    """Each import of a layer in ``source``, and each string constant naming a layer's module, as ``file:line``."""
    found = [
        f"{where}:{line}: import {target}" for target, line in imports_of(where) if target.startswith(LAYER_PACKAGE)
    ]
    for node in ast.walk(ast.parse(source)):
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
        if LAYER_PACKAGE + "." in text and "\n" not in text:  # an import path; prose in a docstring is not one
            found.append(f"{where}:{node.lineno}: {text!r}")
    return found


def test_the_core_imports_no_layer() -> None:
    found = [hit for path in core_modules().values() for hit in reaches_into_a_layer(path.read_text(), path)]
    assert found == []


def test_the_check_finds_an_import_of_a_layer_even_inside_a_function(tmp_path: Path, monkeypatch) -> None:
    import test_import_contract

    monkeypatch.setattr(test_import_contract, "ROOT", tmp_path)  # imports_of names modules relative to the root
    sneaky = tmp_path / "project" / "sneaky.py"
    sneaky.parent.mkdir()
    sneaky.write_text(
        'def f():\n    from project.extras.sweep import driver\nROW = "project.extras.sweep.driver:main"\n'
    )
    assert len(reaches_into_a_layer(sneaky.read_text(), sneaky)) == 3  # the module, the name in it, the string


@pytest.mark.parametrize("layer", installed(), ids=lambda layer: layer.name)
def test_each_layer_is_a_folder_whose_hooks_import(layer) -> None:
    assert (EXTRAS / layer.name / "layer.py").is_file()
    paths = [*layer.sections, *layer.callbacks, *layer.on_trainer, *layer.scenarios, *layer.strategies]
    paths += [*layer.parallel, *layer.degrees, *layer.plan_notes, *layer.plan_report, *layer.checkpoint_formats]
    for row in layer.commands:
        paths += [p for p in (row.runner, row.arguments, row.settings, row.trainer_kwargs) if p is not None]
    for path in paths:
        assert path.startswith(f"{LAYER_PACKAGE}.{layer.name}."), path  # a layer's hooks live in its own folder
        assert callable(hook(path)), path


def test_a_layer_imports_only_the_core_itself_and_what_it_requires() -> None:
    requires = {layer.name: {layer.name, *layer.requires} for layer in installed()}
    crossing = []
    for name, path in MODULES.items():
        if not name.startswith(LAYER_PACKAGE + "."):
            continue
        own = name.split(".")[2]
        for target, line in imports_of(path):
            if target.startswith(LAYER_PACKAGE + ".") and target.split(".")[2] not in requires.get(own, {own}):
                crossing.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert crossing == []
