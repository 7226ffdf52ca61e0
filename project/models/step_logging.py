"""Per-step values logged only on the steps the Trainer writes (``log_every_n_steps``): ``self.log`` costs 0.7 ms."""

from __future__ import annotations

from typing import Any

import lightning as L
from torch import Tensor


def is_logged_step(trainer: L.Trainer) -> bool:
    """Whether the step just ended (in ``on_train_batch_end``) is written; every step with ``log_every_n_steps: 0``."""
    every = trainer.log_every_n_steps
    return not every or bool(trainer.fast_dev_run) or trainer.should_stop or trainer.global_step % every == 0


def log_on_logged_steps(module: L.LightningModule, name: str, value: Tensor | float | None, **kwargs: Any) -> None:
    """``module.log(name, value, on_step=True, on_epoch=False, **kwargs)`` on logged steps only (``None``: nothing)."""
    if value is not None and is_logged_step(module.trainer):
        module.log(name, value, on_step=True, on_epoch=False, **kwargs)
