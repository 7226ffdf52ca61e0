"""``make strip EXTRAS="sweep tracking"`` (or ``EXTRAS=all``): delete optional layers from this checkout.

A layer is a folder ``project/extras/<name>/`` with a ``layer.py``. Stripping it deletes, for each name:

- its code, ``project/extras/<name>/``; its tests, ``tests/extras/<name>/``; its page, ``docs/extras/<name>.md``;
  its configs, ``configs/<name>/``; its notebooks, ``notebooks/<name>/``; its benches, ``bench/extras/<name>/``;
- its extras in ``pyproject.toml`` (``<name> = [...]`` and ``<name>-<part> = [...]``, e.g. ``storage`` and
  ``storage-server``, under ``[project.optional-dependencies]``) and their ``--extra`` in the Makefile's lock recipe;
- every line of README.md and docs/ marked ``<!-- extras:<name> -->``, and every block between a line
  ``<!-- extras:<name> -->`` and a line ``<!-- /extras:<name> -->``;
- every cell of ``notebooks/*.ipynb`` tagged ``extras:<name>`` (the cell's metadata ``tags``).

A layer whose ``requires`` names a stripped one goes too (it imports it). Standard library only: it runs before any
install, and reads each ``layer.py`` as text (``requires=(...)``), so a broken layer cannot stop its own removal.
What remains passes ``make test``; commit the result to make the template yours.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ROOT / "project" / "extras"


def layers(root: Path = ROOT) -> dict[str, set[str]]:
    """The layers present: name -> the layers it requires (read from ``layer.py``'s ``requires=(...)``)."""
    found = {}
    for folder in sorted((root / "project" / "extras").glob("*/layer.py")):
        requires: set[str] = set()
        for node in ast.walk(ast.parse(folder.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "requires":
                requires = {element.value for element in getattr(node.value, "elts", [])}
        found[folder.parent.name] = requires
    return found


def to_strip(asked: list[str], present: dict[str, set[str]]) -> list[str]:
    """The layers to remove: those asked (``all``: every one), and every layer that requires one of them.

    Raises:
        SystemExit: a name that is not a layer here, in one line naming the layers there are.
    """
    if asked == ["all"]:
        return sorted(present)
    unknown = [name for name in asked if name not in present]
    if unknown:
        raise SystemExit(
            f"error: EXTRAS={' '.join(asked)}: {', '.join(unknown)} is not a layer of this checkout; "
            f"the layers are: {', '.join(sorted(present)) or 'none'} (or EXTRAS=all)"
        )
    chosen = set(asked)
    while True:  # a layer importing a stripped one would break: it goes too
        more = {name for name, needs in present.items() if needs & chosen} - chosen
        if not more:
            return sorted(chosen)
        chosen |= more


def unmark(text: str, name: str) -> str:
    """``text`` without the lines and blocks marked for layer ``name``."""
    mark, end = f"<!-- extras:{name} -->", f"<!-- /extras:{name} -->"
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.strip() == mark:
            skipping = True
        elif line.strip() == end:
            skipping = False
        elif not skipping and mark not in line:
            kept.append(line)
    return "".join(kept)


#: A layer's extras: ``<name>`` itself and ``<name>-<part>`` (the storage layer's ``storage-server``).
EXTRA = r"{name}(?:-[A-Za-z0-9]+)*"


def drop_cells(notebook: str, name: str) -> str:
    """A notebook's JSON text without the cells tagged ``extras:<name>`` (unchanged text when none is)."""
    data = json.loads(notebook)
    kept = [cell for cell in data["cells"] if f"extras:{name}" not in cell.get("metadata", {}).get("tags", [])]
    if len(kept) == len(data["cells"]):
        return notebook
    data["cells"] = kept
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def drop_extra(pyproject: str, name: str) -> str:
    """``pyproject.toml`` without the layer's optional dependencies (``name = [...]``, ``name-part = [...]``).

    Each goes with the comment lines right above it; a list ends at a line that is only ``]``.
    """
    extra = EXTRA.format(name=re.escape(name))
    pattern = re.compile(rf"((?:^#[^\n]*\n)*)^{extra} = \[\n(?:(?!\]\n)[^\n]*\n)*?\]\n", re.MULTILINE)
    return pattern.sub("", pyproject)


def drop_from_makefile(makefile: str, name: str) -> str:
    """The Makefile without the layer's ``--extra <name>`` (and ``-<part>``) and ``,<name>`` in extras lists."""
    extra = EXTRA.format(name=re.escape(name))
    makefile = re.sub(rf" --extra {extra}(?![\w-])", "", makefile)
    return re.sub(rf",{extra}(?=[,\]])", "", makefile)


def strip(names: list[str], root: Path = ROOT) -> list[str]:
    """Remove the layers ``names`` from the checkout at ``root``; the paths removed, relative to it."""
    removed = []
    for name in names:
        for path in (
            root / "project" / "extras" / name,
            root / "tests" / "extras" / name,
            root / "docs" / "extras" / f"{name}.md",
            root / "configs" / name,
            root / "notebooks" / name,
            root / "bench" / "extras" / name,
        ):
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
            else:
                continue
            removed.append(str(path.relative_to(root)))
        for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
            if page.exists():
                text = page.read_text(encoding="utf-8")
                if unmark(text, name) != text:
                    page.write_text(unmark(text, name), encoding="utf-8")
        for notebook in sorted((root / "notebooks").glob("*.ipynb")):
            text = notebook.read_text(encoding="utf-8")
            if drop_cells(text, name) != text:
                notebook.write_text(drop_cells(text, name), encoding="utf-8")
        pyproject = root / "pyproject.toml"
        pyproject.write_text(drop_extra(pyproject.read_text(encoding="utf-8"), name), encoding="utf-8")
        makefile = root / "Makefile"
        makefile.write_text(drop_from_makefile(makefile.read_text(encoding="utf-8"), name), encoding="utf-8")
    return removed


def main(argv: list[str] | None = None) -> None:
    """Strip the layers named on the command line (``all``: every one) and say what went."""
    parser = argparse.ArgumentParser(prog="make strip EXTRAS=...", description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="*", help="layer names, or all")
    asked = parser.parse_args(argv).extras
    present = layers()
    if not asked:
        raise SystemExit(f"error: EXTRAS is empty; name layers to remove: {', '.join(sorted(present))} (or all)")
    names = to_strip(asked, present)
    for path in strip(names):
        print(f"removed {path}")
    print(f"stripped {', '.join(names) or 'nothing'}; kept {', '.join(sorted(set(present) - set(names))) or 'none'}")


if __name__ == "__main__":
    main(sys.argv[1:])
