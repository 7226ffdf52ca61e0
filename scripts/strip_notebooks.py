"""Strip outputs, execution counts and run metadata from notebooks, so that they are committed clean.

    python scripts/strip_notebooks.py notebooks/*.ipynb          # strip in place
    python scripts/strip_notebooks.py --check notebooks/*.ipynb  # only report

Exit code 1 when a notebook had something to strip (pre-commit's convention: the hook fails once,
the files are fixed, committing again passes), 0 when every notebook was already clean. Only the
standard library is used, so the pre-commit hook needs no environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

# Cell metadata that executing a notebook adds (nbclient's timings, Jupyter's collapsed/scrolled state).
RUN_CELL_METADATA = ("execution", "collapsed", "scrolled", "ExecuteTime")
# Notebook metadata that records one machine's run rather than the notebook itself.
RUN_NOTEBOOK_METADATA = ("widgets", "papermill")


def strip(notebook: dict[str, Any]) -> bool:
    """Remove outputs, execution counts and run metadata from ``notebook`` in place; True if anything changed."""
    changed = False
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            if cell.get("outputs"):
                cell["outputs"] = []
                changed = True
            if cell.get("execution_count") is not None:
                cell["execution_count"] = None
                changed = True
        metadata = cell.get("metadata", {})
        for key in RUN_CELL_METADATA:
            if key in metadata:
                del metadata[key]
                changed = True
    metadata = notebook.get("metadata", {})
    for key in RUN_NOTEBOOK_METADATA:
        if key in metadata:
            del metadata[key]
            changed = True
    return changed


def dumps(notebook: dict[str, Any]) -> str:
    """Serialise the way nbformat writes notebooks (indent 1, sorted keys, UTF-8, final newline)."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Strip (or with ``--check`` only report) the notebooks named on the command line; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebook files (.ipynb)")
    parser.add_argument("--check", action="store_true", help="report notebooks with outputs, change nothing")
    args = parser.parse_args(argv)
    dirty = []
    for path in args.notebooks:
        try:
            notebook = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            print(f"error: cannot read notebook '{path}': {error}", file=sys.stderr)
            return 2
        if strip(notebook):
            dirty.append(path)
            if not args.check:
                # Write beside, then rename: an interrupted run never leaves half a notebook.
                temporary = path.with_name(f".{path.name}.tmp")
                temporary.write_text(dumps(notebook), encoding="utf-8")
                os.replace(temporary, path)
    verb = "carries outputs or execution counts" if args.check else "stripped"
    for path in dirty:
        print(f"{path}: {verb}")
    return 1 if dirty else 0


if __name__ == "__main__":
    sys.exit(main())
