"""A copy of this checkout (tracked and untracked files, as git sees them) for the strip tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from helpers import REPO


def copy_checkout(destination: Path) -> Path:
    """Copy the files ``git ls-files`` lists (committed or not, not ignored) to ``destination``.

    A copy, not a clone: the work in progress is what is tested. Layers already deleted from the work tree stay
    deleted.
    """
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination
