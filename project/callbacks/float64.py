"""``parallel.precision: 64``: the module in float64 before a checkpoint is restored into it."""

from __future__ import annotations

import lightning as L


class Float64BeforeRestore(L.Callback):
    """Convert the module to float64 at ``setup``, before Lightning restores a checkpoint's weights into it.

    Most strategies restore before the precision plugin converts: a resume would start from float32-rounded weights.
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Every parameter and buffer of floating type becomes float64 (what the plugin does later, earlier)."""
        pl_module.double()
