"""Which checkpoint a command starts from: ``--ckpt_path FILE|last|none``, ``fit --resume auto``; each loaded once.

``last``/``auto`` take the newest checkpoint of the run name (the logger's ``save_dir``/``name``) that loads safely
and holds a full training state. ``fit`` continues in that run's own folder, so its curves, checkpoints and best
paths stay together; with none it starts a new run (a job that restarts itself). Every rank resolves it alike.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only

from project.checkpoints.formats import checkpoints_in, final_name, recover
from project.checkpoints.loading import read_checkpoint, read_resumable
from project.commands import COMMANDS
from project.errors import UserError
from project.run_store import active, local_copy

RESUME_AUTO = "auto"
NO_CHECKPOINT = "none"  # --ckpt_path none: evaluate the weights the config builds, on purpose
LIGHTNING_CKPT_PATHS = ("hpc", "registry")  # --ckpt_path values that Lightning resolves itself
_DEFAULT_LOGGER = "lightning.pytorch.loggers.TensorBoardLogger"
_DEFAULT_LOGGER_NAME = "lightning_logs"


def _say(message: str) -> None:
    if rank_zero_only.rank == 0:
        print(message, file=sys.stderr, flush=True)


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
        # A store's cache: committed ones only.
        files = [found for run in runs for found in checkpoints_in(run / "checkpoints") if active().committed(found)]
        return sorted(files, key=lambda f: (f.stat().st_mtime_ns, final_name(f).name == "last.ckpt"), reverse=True)


def _logger_section(trainer: Namespace) -> Any:
    logger = trainer.get("logger")
    if isinstance(logger, list):
        return logger[0] if logger else False  # the first logger names the checkpoint folder
    return logger


def run_name(trainer: Namespace) -> RunName:
    """The run name of a ``trainer`` config section, from its (first) logger's ``save_dir``/``name``/``version``."""
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
    return RunName(Path(root) / name, f"version_{version}" if isinstance(version, int) else version)


@dataclass(frozen=True)
class Chosen:
    """A checkpoint file and its contents, loaded once (``checkpoint`` is ``None`` for Lightning's own names)."""

    path: str
    checkpoint: dict[str, Any] | None = None
    continues: bool = False  # fit continues the run this checkpoint belongs to (--resume auto, --ckpt_path last)

    def describe(self) -> str:
        """``epoch E, step S`` of a training checkpoint."""
        data = self.checkpoint or {}
        return f"epoch {data.get('epoch')}, step {data.get('global_step')}"


def find_resume_checkpoint(name: RunName) -> tuple[Path, str] | None:
    """The newest good checkpoint of ``name`` and a short description of it; ``None`` when there is none."""
    found = _find_newest_good(name)
    return (Path(found.path), found.describe()) if found is not None else None


def _find_newest_good(name: RunName) -> Chosen | None:
    for path in name.checkpoint_files():
        try:
            checkpoint = read_resumable(path)
        except UserError as error:
            _say(f"warning: skipping checkpoint {path}: {error}")
            continue
        if isinstance(checkpoint, dict) and "state_dict" in checkpoint and "loops" in checkpoint:
            return Chosen(str(path), checkpoint)
        _say(
            f"warning: skipping checkpoint {path}: '{path}' holds no training state (weights only), so training "
            "cannot continue from it"
        )
    return None


def _continue_in(trainer: Namespace, run: Path) -> None:
    """Point the (first) logger at the resumed run's folder ``<save_dir>/<name>/<version>``, wherever it is."""
    logger = _logger_section(trainer)
    if logger is None or logger is True:
        logger = trainer.logger = Namespace(
            class_path=_DEFAULT_LOGGER,
            init_args=Namespace(save_dir=trainer.get("default_root_dir") or ".", name=_DEFAULT_LOGGER_NAME),
        )
    if logger.get("init_args") is None:
        logger.init_args = Namespace()
    # save_dir and name too, where they point elsewhere: a run's own config given from another working directory.
    root = Path(logger.init_args.get("save_dir") or ".") / (logger.init_args.get("name") or "")
    if root.resolve() != run.parent.resolve():
        logger.init_args.save_dir, logger.init_args.name = str(run.parent.parent), run.parent.name
    logger.init_args.version = run.name


def remove_partial_writes(chosen: Chosen | None) -> None:
    """Complete a swap a kill interrupted, delete ``.*.tmp`` where ``fit`` continues (rank 0, under the run's lock)."""
    if chosen is not None and chosen.continues and rank_zero_only.rank == 0:
        recover(Path(chosen.path).parent)


def choose_checkpoint(
    command: str, ckpt_path: str | None, resume: str | None, trainer: Namespace, run: Path | None = None
) -> Chosen | None:
    """The checkpoint ``command`` starts from, loaded once; ``None`` for none (UserError: none can be chosen).

    ``--resume auto`` / ``--ckpt_path last`` take the newest good checkpoint of the run name (or of ``run``, the run
    directory whose own ``config.yaml`` was given); ``fit`` also points the ``trainer``'s logger at its run folder.
    """
    if resume is not None and ckpt_path is not None:
        raise UserError(
            f"--resume {resume} and --ckpt_path {ckpt_path} both choose the checkpoint; give only one "
            "(--resume auto finds the newest good one of this run name)"
        )
    if ckpt_path == NO_CHECKPOINT or (ckpt_path is None and resume is None):
        return None
    if ckpt_path in LIGHTNING_CKPT_PATHS:
        return Chosen(ckpt_path)
    if ckpt_path == "best":
        raise UserError(
            "--ckpt_path best means the best checkpoint of a fit in this same process (fit tests it by itself); "
            "give the file (logs/<name>/version_<n>/checkpoints/best-*.ckpt) or `last`"
        )
    if resume != RESUME_AUTO and ckpt_path != "last":
        path = local_copy(str(ckpt_path))  # a URL: its committed copy, pulled into this node's cache
        return Chosen(path, read_checkpoint(path))
    asked = f"--resume {resume}" if resume is not None else "--ckpt_path last"
    name = RunName(run.parent, run.name) if run is not None else run_name(trainer)
    found = _find_newest_good(name)
    if found is None:
        if not COMMANDS[command].trains:  # an evaluation needs weights; a training starts a new run
            raise UserError(
                f"{asked}: no usable checkpoint under {name.root}; train first (fit) or give --ckpt_path PATH"
            )
        _say(f"{asked}: no checkpoint of this run name under {name.root} yet, starting a new run")
        return None
    if COMMANDS[command].trains:  # a training continues in the run it resumes
        path = final_name(Path(found.path))  # where remove_partial_writes puts it, holding the run's lock
        run = path.parent.parent
        _continue_in(trainer, run)
        found = replace(found, path=str(path), continues=True)
        # Lightning warns about a non-empty checkpoint folder; continuing in it is the point here.
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        _say(f"Resuming from {path} ({found.describe()}); the run continues in {run}")
    return found
