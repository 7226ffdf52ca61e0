"""A run directory reserved before a run and put back as it was when the run is refused before its first step."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from project.errors import UserError
from project.run_store import active
from project.runs import reserve_run_directory

if TYPE_CHECKING:
    import lightning as L


def _times(path: Path) -> tuple[int, int]:
    return (stat := path.stat()).st_atime_ns, stat.st_mtime_ns


@dataclass(frozen=True)
class RunDirectoryGuard:
    """A run directory and its parents before a run, to undo a refused one (Lightning creates it before ``setup``)."""

    run_dir: Path | None
    existed: frozenset[Path] = frozenset()
    times: tuple[tuple[Path, tuple[int, int]], ...] = ()

    @classmethod
    def of(cls, trainer: L.Trainer, continuing: bool) -> RunDirectoryGuard:
        """Reserve ``trainer``'s run directory (rank 0), noting what existed; only a ``continuing`` run reuses one."""
        logger = trainer.logger
        # root_dir first: asking for log_dir would make the logger choose its version by listing the folders.
        if logger is None or not (getattr(logger, "root_dir", None) or getattr(logger, "log_dir", None)):
            return cls(None)
        root = Path(getattr(logger, "root_dir", None) or Path(logger.log_dir).parent)
        parents = (root, root.parent)
        existed = {folder for folder in parents if folder.exists()}
        times = tuple((f, _times(f)) for f in parents if f in existed)
        reserved = reserve_run_directory(logger) if trainer.is_global_zero else None
        run_dir = reserved or Path(logger.log_dir)
        if reserved is None and run_dir.exists():  # a resumed run's (or a pinned version's): keep what is there
            held = sorted(p.relative_to(run_dir) for p in run_dir.iterdir())
            # Rank 0 alone decides: another rank may list the version rank 0 reserved a moment before.
            if held and not continuing and trainer.is_global_zero:
                raise UserError(
                    f"the run directory {run_dir} already holds a run ({', '.join(map(str, held[:3]))}); a new run "
                    "never writes into it: drop the logger's `version` to start the next version, or continue "
                    "that run with `fit --resume auto`"
                )
            existed |= {run_dir, *run_dir.rglob("*")}
            times = (*times, (run_dir, _times(run_dir)))
        return cls(run_dir, frozenset(existed), times)

    def undo(self) -> None:
        """Remove what the run added, deepest first, and restore the folders' times: as if it never started."""
        if self.run_dir is None:
            return
        if self.run_dir not in self.existed:
            active().unreserve(self.run_dir)  # a run directory in object storage: its reservation there too
        added = [p for p in self.run_dir.rglob("*") if p not in self.existed] if self.run_dir.exists() else []
        for path in sorted(added, key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for folder in (self.run_dir, self.run_dir.parent, self.run_dir.parent.parent):
            if folder not in self.existed:
                shutil.rmtree(folder, ignore_errors=True)
        for folder, times in self.times:
            if folder.exists():
                os.utime(folder, ns=times)
