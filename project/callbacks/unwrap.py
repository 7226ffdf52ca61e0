"""The seed's ``model = model.module`` for evaluation.

During ``fit`` Lightning validates through the DDP wrapper; this evaluates the bare module (rank 0's buffers, over
unpadded shards). Its ``export`` settings are the export layer's: without it ``export: true`` writes one note.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L

from project.parallel.ddp import Unwrapped, evaluate_unwrapped, rewrap


class UnwrapEvalCallback(L.Callback):
    """Evaluate the unwrapped module during fit; its export settings are the export layer's.

    Args:
        export: Write ``export/model.pt`` and ``export/model.json`` into the run directory at fit end (the
            export layer does; without it one ``note:`` line says nothing was written).
        export_best: Export the best checkpoint's weights (the ones ``test`` after fit evaluates)
            instead of the final ones, when a monitored checkpoint exists.
        net_attribute: Attribute of the LightningModule that holds the plain network; ``None``: ``net``,
            or the module's only child with parameters.
    """

    def __init__(self, export: bool = True, export_best: bool = True, net_attribute: str | None = None) -> None:
        self.export, self.export_best, self.net_attribute = export, export_best, net_attribute
        self._unwrapped: Unwrapped | None = None
        #: The layer's callback that writes the export (filled at its ``setup``), if any.
        self.exporter: Any = None
        #: Path of the last export (rank 0), for the CLI's closing message.
        self.export_dir: Path | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``export: true`` with no layer to write it: one line, and the run trains as asked."""
        if self.export and self.exporter is None and trainer.is_global_zero and not trainer.fast_dev_run:
            sys.stderr.write(
                "note: UnwrapEvalCallback(export=true): no export/ is written, no installed layer writes it "
                "(the export layer does); set export: false to silence this\n"
            )

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Swap the DDP wrapper for the bare module while validating (``model = model.module``)."""
        self._unwrapped = evaluate_unwrapped(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Put the wrapper, and each rank's own buffers, back for training."""
        rewrap(trainer, pl_module, self._unwrapped)
        self._unwrapped = None
