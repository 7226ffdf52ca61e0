"""Read back what a run left behind in its run directory (``logs/<name>/version_<n>/``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from project.errors import UserError
from project.lightning_private import choose_version, unchosen_version
from project.run_store import active


def read_scalars(run_dir: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """All scalars of a run's TensorBoard event files (one per stage, oldest first), ``tag -> [(step, value)]``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # slow to import

    scalars: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(Path(run_dir).glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})  # 0: keep every point
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((event.step, event.value) for event in accumulator.Scalars(tag))
    return scalars


def run_directory(trainer: Any) -> str | None:
    """``trainer.log_dir``, broadcast from rank 0: call it on EVERY rank, never under a rank check (Lightning#18148)."""
    return trainer.log_dir


def run_of_config(configs: list[Any]) -> Path | None:
    """The run whose ``config.yaml`` is a ``--config`` file, if any: ``--resume auto``/``last`` then mean that run."""
    for config in configs:
        path = Path(getattr(config, "absolute", None) or str(config))
        folder = path.parent  # a run directory holds plan.json or checkpoints/ beside its config.yaml
        if path.name == "config.yaml" and ((folder / "plan.json").is_file() or (folder / "checkpoints").is_dir()):
            return folder
    return None


def refuse_unplain_names(logger: Any, version_chosen: bool) -> None:
    """Refuse (``UserError``) a run name or chosen version that is a path: the run would be written outside save_dir."""
    values = {"name": getattr(logger, "name", "")}
    if version_chosen:  # else the logger would choose it by listing its folders (reading it now would fix it)
        values["version"] = getattr(logger, "version", None)
    for key, value in values.items():
        text = str(value)
        if value is not None and (text in (".", "..") or any(sep in text for sep in ("/", "\\", os.sep, "\0"))):
            raise UserError(
                f"run {key} {text!r} (--trainer.logger.init_args.{key}) is a path: a run {key} must be a plain "
                f"folder name, no '/', '\\' or '..', or the run would be written outside the logger's save_dir "
                f"{getattr(logger, 'save_dir', '')!r}; give a plain name (and set save_dir for where runs go)"
            )


def reserve_run_directory(logger: Any) -> Path | None:
    """Create the next ``version_<n>`` folder of ``logger``'s run name atomically and make the logger use it.

    Lightning chooses a version by listing the folders, so two runs of one name started at once would share one;
    ``mkdir`` either creates a folder or fails. Rank 0 only. ``None``: the version is set, or the store is remote.
    """
    root = getattr(logger, "root_dir", None)
    if root is None or "://" in str(root):
        return None
    version = unchosen_version(logger)
    refuse_unplain_names(logger, version is None)
    if version is None:
        return None
    in_store = active().reserve(Path(root), version)  # a run directory in object storage: reserved there
    while True:
        folder = Path(root) / f"version_{in_store if in_store is not None else version}"
        try:
            Path(root).mkdir(parents=True, exist_ok=True)
            folder.mkdir(exist_ok=in_store is not None)  # the store's reservation decides; the cache may lag
        except FileExistsError:
            version += 1
            continue
        except OSError as error:  # read-only, full, or a file where a folder should be
            raise UserError(
                f"cannot create the run directory {folder} ({error.strerror or error}); point the logger's save_dir "
                "at a writable folder (--trainer.logger.init_args.save_dir PATH)"
            ) from error
        choose_version(logger, in_store if in_store is not None else version)
        return folder
