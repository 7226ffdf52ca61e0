"""The ``tracking`` section applied to a built Trainer: the store checked on rank 0, the callback added.

Only ``fit`` is tracked (with the test after it): validate, test and predict of a run's ``config.yaml``, which
holds the section, leave the run's MLflow record as the training left it.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from project.commands import Command
from project.errors import UserError
from project.extras.tracking.callback import TrackingCallback
from project.extras.tracking.config import resolve_store, resumed_run_id, tracking_settings


def attach_tracking(trainer: L.Trainer, config: Any, chosen: Any, row: Command) -> None:
    """Add :class:`TrackingCallback` to ``trainer`` when the ``tracking`` section turns a logger on.

    Args:
        trainer: The built Trainer; its first logger (TensorBoard) owns the run directory.
        config: The command's parsed config; its ``tracking`` section (``None``: absent) decides.
        chosen: The checkpoint the command starts from (:class:`project.checkpoints.resume.Chosen`), or ``None``.
        row: The command's row; only one that tracks (``fit``) is.

    Raises:
        UserError: no logger owns a run directory, or MLflow cannot use the store (rank 0 checks it, before any
            file of the run is written).
    """
    settings = tracking_settings(config.get("tracking"))
    # fast_dev_run turns Lightning's loggers off
    if settings is None or not row.tracks or trainer.fast_dev_run:
        return
    if not trainer.loggers:
        raise UserError(
            f"tracking.logger={settings.logger} logs beside the run directory's own logger, but trainer.logger is "
            "false; configure one (configs/digits.yaml has TensorBoard) or set tracking.logger: none"
        )
    store = resolve_store(settings, trainer.loggers[0].name)
    client = None
    if trainer.is_global_zero:  # the other ranks never touch the store: rank 0 logs for all of them
        from project.extras.tracking.store import check_store

        client = check_store(store)
    checkpoint = getattr(chosen, "checkpoint", None)
    start_step = int((checkpoint or {}).get("global_step", 0))
    resumed = (resumed_run_id(checkpoint), getattr(chosen, "path", None))
    trainer.callbacks.append(TrackingCallback(store, settings.tags, resumed, start_step, client))
