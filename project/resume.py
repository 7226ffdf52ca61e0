"""``fit --resume auto`` and ``--ckpt_path last``: find the newest good checkpoint of this run name.

A run name is the logger's ``save_dir``/``name`` (``logs/digits``); its runs are the version folders
under it and their checkpoints live in ``<version>/checkpoints/``. The newest checkpoint file (by
modification time, ``last.ckpt`` first on a tie) that loads with ``weights_only=True`` and holds a
full training state wins; a truncated, corrupt or weights-only file is skipped with a warning.

Resuming continues in the resumed run's own folder (the logger's ``version`` is set to it): the
TensorBoard curves, ``checkpoints/`` and ``export/`` of one training stay together, and the
checkpoint callbacks' state (best model path, top-k) refers to files that are really there. With
nothing to resume, ``fit`` starts a new run, which is what a job that restarts itself wants on its
first start.

Every process resolves this by itself from the same files, before any of them trains, so all
ranks pick the same checkpoint; :class:`project.callbacks.resume.ResumeCallback` checks that they did.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only

from project.errors import UserError
from project.export import safe_load

#: ``--resume`` values: ``auto`` continues the newest good checkpoint of the run name, or starts fresh.
RESUME_AUTO = "auto"
# Lightning's default logger when ``trainer.logger`` is true/unset.
_DEFAULT_LOGGER = "lightning.pytorch.loggers.TensorBoardLogger"
_DEFAULT_LOGGER_NAME = "lightning_logs"


def _say(message: str) -> None:
    """One line on stderr, from one process only (each rank resolves the same thing)."""
    if rank_zero_only.rank == 0:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


@dataclass(frozen=True)
class RunName:
    """Where the runs of one name live: ``root`` (``logs/<name>``) and, if the config fixes it, the version."""

    root: Path
    version: str | None = None

    def checkpoint_files(self) -> list[Path]:
        """Every ``*.ckpt`` of every run of this name, newest first (``last.ckpt`` first among equals)."""
        if self.version is not None:
            runs = [self.root / self.version]
        else:
            runs = [p for p in self.root.iterdir() if p.is_dir()] if self.root.is_dir() else []
        # Hidden files are the temporary halves of atomic writes, never checkpoints.
        files = [f for run in runs for f in (run / "checkpoints").glob("*.ckpt") if not f.name.startswith(".")]
        return sorted(files, key=lambda f: (f.stat().st_mtime_ns, f.name == "last.ckpt"), reverse=True)


def _logger_section(trainer: Namespace) -> Any:
    logger = trainer.get("logger")
    if isinstance(logger, list):
        return logger[0] if logger else False  # the first logger names the checkpoint folder
    return logger


def run_name(trainer: Namespace) -> RunName:
    """The run name of a ``trainer`` config section, from its (first) logger's ``save_dir``/``name``/``version``.

    Raises:
        UserError: the run has no logger, so there are no run folders to resume from.
    """
    logger = _logger_section(trainer)
    if logger is False:
        raise UserError(
            "--resume auto / --ckpt_path last look for checkpoints in the logger's run folders, but "
            "trainer.logger is false; give the checkpoint with --ckpt_path PATH, or configure a logger"
        )
    if logger is None or logger is True:
        root, name, version = trainer.get("default_root_dir") or ".", _DEFAULT_LOGGER_NAME, None
    else:
        args = logger.get("init_args") or Namespace()
        root, name, version = args.get("save_dir") or ".", args.get("name") or "", args.get("version")
    if isinstance(version, int):
        version = f"version_{version}"
    return RunName(Path(root) / name, version)


def _is_resumable(path: Path) -> tuple[bool, str]:
    """Whether ``path`` loads safely and holds a full training state; the reason when it does not."""
    try:
        checkpoint = safe_load(path)
    except UserError as error:
        return False, str(error)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint or "loops" not in checkpoint:
        return False, f"'{path}' holds no training state (weights only), so training cannot continue from it"
    return True, f"epoch {checkpoint.get('epoch')}, step {checkpoint.get('global_step')}"


def find_resume_checkpoint(name: RunName) -> tuple[Path, str] | None:
    """The newest good checkpoint of ``name`` and a short description of it; ``None`` when there is none."""
    for path in name.checkpoint_files():
        good, detail = _is_resumable(path)
        if good:
            return path, detail
        _say(f"warning: skipping checkpoint {path}: {detail}")
    return None


def _continue_in(trainer: Namespace, version: str) -> None:
    """Point the (first) logger at the resumed run's folder, so the run continues where it was."""
    logger = _logger_section(trainer)
    if logger is None or logger is True:
        logger = Namespace(
            class_path=_DEFAULT_LOGGER,
            init_args=Namespace(save_dir=trainer.get("default_root_dir") or ".", name=_DEFAULT_LOGGER_NAME),
        )
        trainer.logger = logger
    if logger.get("init_args") is None:
        logger.init_args = Namespace()
    logger.init_args.version = version


def _remove_partial_writes(checkpoints: Path) -> None:
    """Delete what a process killed during an atomic save left behind (hidden ``.*.tmp`` files)."""
    if rank_zero_only.rank == 0:
        for partial in checkpoints.glob(".*.tmp"):
            partial.unlink(missing_ok=True)


def resolve_resume(section: Namespace, subcommand: str) -> Path | None:
    """Replace ``--resume auto`` / ``--ckpt_path last`` in a parsed subcommand ``section`` by a checkpoint file.

    ``fit`` also continues in that checkpoint's run folder; with nothing to resume it starts a new run.
    ``validate``/``test``/``predict`` take the newest good checkpoint, or fail when there is none.

    Returns:
        The checkpoint chosen, or ``None`` (nothing asked, or ``fit`` starting fresh).

    Raises:
        UserError: both options given, no logger, or nothing to evaluate.
    """
    resume = section.get("resume")
    ckpt_path = section.get("ckpt_path")
    if resume is not None and ckpt_path is not None:
        raise UserError(
            f"--resume {resume} and --ckpt_path {ckpt_path} both choose the checkpoint; give only one "
            "(--resume auto finds the newest good one of this run name)"
        )
    if resume != RESUME_AUTO and ckpt_path != "last":
        return None
    asked = f"--resume {resume}" if resume is not None else "--ckpt_path last"
    name = run_name(section.trainer)
    found = find_resume_checkpoint(name)
    if found is None:
        if subcommand != "fit":
            raise UserError(
                f"{asked}: no usable checkpoint under {name.root}; train first (fit) or give --ckpt_path PATH"
            )
        _say(f"{asked}: no checkpoint of this run name under {name.root} yet, starting a new run")
        section.ckpt_path = None
        return None
    path, detail = found
    section.ckpt_path = str(path)
    if subcommand == "fit":
        run = path.parent.parent
        _continue_in(section.trainer, run.name)
        _remove_partial_writes(path.parent)
        # Lightning warns about a non-empty checkpoint folder; continuing in it is the point here.
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        _say(f"Resuming from {path} ({detail}); the run continues in {run}")
    return path
