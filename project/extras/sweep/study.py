"""Where a study lives and who runs it: ``logs/sweeps/<study>/`` (SQLite, trial folders, results), one driver at once.

The study is an Optuna study in ``study.db`` (SQLite through Optuna's RDBStorage: a transaction either happened or
did not, whenever the driver is killed). Its folder also holds one folder per trial (``trial_<n>/``: the logger's run
folders, the trial's output and result file), the driver's lock and, at the end, ``trials.csv`` and the plots.

One driver per study: it holds the folder's lock (:class:`project.run_lock.TrainingLock`, a POSIX lock the kernel
drops when the driver dies, however it dies), so a second driver on the same study is refused in one line, and the
next one after a ``kill -9`` goes ahead.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from project.errors import UserError
from project.extras.sweep.contract import open_storage
from project.extras.sweep.setup import Setup, check_setup, fingerprint
from project.extras.sweep.space import Space
from project.run_lock import TrainingLock, holder_of

#: Studies live here, relative to the working directory, beside the runs of ``logs/<name>/``.
SWEEPS = Path("logs") / "sweeps"
#: The study's user attribute that holds its :class:`Setup`.
SETUP_ATTR = "sweep_setup"


@dataclass(frozen=True)
class StudyPaths:
    """The files of study ``name``."""

    name: str

    @property
    def folder(self) -> Path:
        """``logs/sweeps/<name>``."""
        return SWEEPS / self.name

    @property
    def storage(self) -> str:
        """The SQLite URL, absolute: trials open it too, from any working directory."""
        return f"sqlite:///{(self.folder / 'study.db').resolve()}"

    def trial_dir(self, number: int) -> Path:
        """``logs/sweeps/<name>/trial_<n>``: the logger's root of trial ``number`` (its runs are ``version_<k>``)."""
        return self.folder / f"trial_{number}"


def new_folders(paths: StudyPaths) -> list[Path]:
    """The folders :func:`hold_study` will create for ``paths`` (none for a study that exists), deepest first."""
    return [folder for folder in (paths.folder, *paths.folder.parents) if folder.parts and not folder.exists()]


def remove_empty(folders: list[Path]) -> None:
    """Remove those of ``folders`` (deepest first) that are empty: what a refused new study created, nothing else."""
    for folder in folders:
        with contextlib.suppress(OSError):  # not empty (the study was created) or already gone
            folder.rmdir()


def hold_study(paths: StudyPaths) -> TrainingLock:
    """Lock the study folder for this driver.

    Raises:
        UserError: another driver runs this study.
    """
    if not paths.name or "/" in paths.name or paths.name.startswith("."):
        raise UserError(f"--study {paths.name!r} must be a plain name (letters, digits, - and _), not a path")
    paths.folder.mkdir(parents=True, exist_ok=True)
    try:
        return TrainingLock.take(paths.folder)
    except UserError:
        holder = holder_of(paths.folder) or {}
        who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, since {holder.get('since', '?')}"
        raise UserError(
            f"study {paths.name} is being run already ({who}); one driver per study: wait for it, or stop it and run "
            "this command again (it continues the study)"
        ) from None


def open_study(paths: StudyPaths, configs: list[str], space: Space) -> tuple[Any, Setup, Any]:
    """The study (created on first use), its setup (checked once per change of files) and the raw storage.

    Raises:
        UserError: other base configs than the study was started with, or a space the base config does not take.
    """
    import optuna

    if not (paths.folder / "study.db").exists():  # a new study: refused (if it is) before study.db is created
        setup = check_setup(configs, space)
        storage, stored = open_storage(paths.storage), None
    else:
        storage = open_storage(paths.storage)
        stored = _stored_setup(storage, paths.name)
        setup = stored if stored is not None and stored.fingerprint == fingerprint(configs, space) else None
    if stored is not None and _resolved(stored.configs) != _resolved(configs):
        given = " ".join(f"--config {c}" for c in stored.configs)
        raise UserError(
            f"study {paths.name} runs its trials with {given}; continue it with the same configs, or start another "
            "study with --study NAME"
        )
    if setup is None:
        setup = check_setup(configs, space)
    if stored is not None and (stored.metric, stored.direction) != (setup.metric, setup.direction):
        raise UserError(
            f"study {paths.name} {stored.direction}s {stored.metric}, the space file now asks to {setup.direction} "
            f"{setup.metric}; start another study with --study NAME"
        )
    count = _trial_count(storage, paths.name)
    # A new seed at each start: a driver started again does not draw the first trials' parameters again.
    sampler = optuna.samplers.TPESampler(seed=None if space.seed is None else space.seed + count)
    study = optuna.create_study(
        storage=storage,
        study_name=paths.name,
        sampler=sampler,
        pruner=space.pruner.build(),
        direction=setup.direction,
        load_if_exists=True,
    )
    study.set_user_attr(SETUP_ATTR, setup.as_dict())
    return study, setup, storage


def _resolved(configs: Any) -> list[Path]:
    return [Path(config).resolve() for config in configs]


def _stored_setup(storage: Any, name: str) -> Setup | None:
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    return Setup.from_dict(storage.get_study_user_attrs(study_id).get(SETUP_ATTR))


def _trial_count(storage: Any, name: str) -> int:
    try:
        return len(storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False))
    except KeyError:
        return 0
