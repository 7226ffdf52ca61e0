"""What the guards layer plugs into the core (``layer.py`` names it): its callbacks, on every Trainer but a self-test's.

The trainable set followed under DDP and kept on resume, the replicas compared at every save, and on a command that
trains the non-finite loss check with the ``nonfinite`` section's settings (unless the config lists its own).
"""

from __future__ import annotations

from typing import Any

from lightning import Callback

from project.commands import Command
from project.extras.guards.config import nonfinite_settings
from project.extras.guards.nonfinite import NonFiniteLossCallback
from project.extras.guards.replica_guard import ReplicaGuard
from project.extras.guards.trainable_set import TrainableSetCallback
from project.run_state import RunState


def lists_nonfinite_check(callbacks: Any) -> bool:
    """Whether ``trainer.callbacks`` (one entry, a list, or ``None``) names a NonFiniteLossCallback of its own."""
    listed = callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]
    for entry in listed:
        path = entry.get("class_path") if hasattr(entry, "get") else getattr(entry, "class_path", None)
        if isinstance(entry, NonFiniteLossCallback) or str(path or "").endswith("NonFiniteLossCallback"):
            return True
    return False


def guard_callbacks(state: RunState, row: Command, config: Any) -> list[Callback]:
    """The guards of a run; a self-test (check) gets none of them.

    DDP reduces what trains now (fine-tuning) and the trainable set survives a resume; the replicas are compared at
    each save; on a command that trains, a nan/inf loss stops or skips the step (the ``nonfinite`` section).
    """
    if row.self_test:
        return []
    own: list[Callback] = [TrainableSetCallback(), ReplicaGuard(state.built)]
    settings = nonfinite_settings(config.get("nonfinite"))
    trainer = config.get("trainer")
    configured = trainer.get("callbacks") if trainer is not None else None
    if row.trains and settings.check_every_n_steps > 0 and not lists_nonfinite_check(configured):
        own.append(NonFiniteLossCallback(settings.action, settings.check_every_n_steps))
    return own
