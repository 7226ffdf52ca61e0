"""A user's callback that notes what the running command does, as any callback sees it (test_command_facts.py).

Each Trainer entry point (fit, validate, test, predict) appends one line to ``facts.jsonl`` in the working directory:
the Trainer method, the checkpoint it starts from, whether this process holds the run directory's training lock,
and which of the template's callbacks the command added (tracking, the stop on a signal, the predictions writer).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning as L

from project.run_lock import holder_of


class CommandProbe(L.Callback):
    """Append what this command is doing to ``facts.jsonl`` at the start of each Trainer entry point."""

    def _note(self, trainer: L.Trainer) -> None:
        run_dir = trainer.log_dir if trainer.loggers else None
        holder = holder_of(run_dir) if run_dir is not None else None
        names = {type(callback).__name__ for callback in trainer.callbacks}
        fact: dict[str, Any] = {
            "method": trainer.state.fn.value if trainer.state.fn is not None else None,
            "ckpt_path": trainer.ckpt_path,
            "locks_run": holder is not None and holder.get("pid") == os.getpid(),
            "tracks": "TrackingCallback" in names,
            "stops_on_signal": "StopOnSignal" in names,
            "writes_predictions": "PredictionsWriter" in names,
        }
        with (Path.cwd() / "facts.jsonl").open("a") as out:
            out.write(json.dumps(fact) + "\n")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``fit`` (and ``check``, which runs fit)."""
        self._note(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``validate`` only: fit's own validation is part of fit."""
        if not trainer.training and trainer.state.fn is not None and trainer.state.fn.value == "validate":
            self._note(trainer)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``test``, and fit's test after it."""
        self._note(trainer)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``predict``."""
        self._note(trainer)
