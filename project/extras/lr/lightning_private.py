"""The lr layer's private torch name: a scheduler's ``_last_lr`` (what ``get_last_lr()`` returns; no setter)."""

from __future__ import annotations

from typing import Any


def set_last_lr(scheduler: Any) -> None:
    """Make a scheduler's ``get_last_lr()`` say its optimizer's current rates (after they were scaled)."""
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
