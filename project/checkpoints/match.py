"""The checkpoint a command starts from matches what it runs, else one line before anything runs.

Not fresh weights evaluated, nor another model's checkpoint failing deep inside Lightning's load.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden

from project.checkpoints.diff import diff_state_dicts
from project.checkpoints.io import AtomicCheckpointIO
from project.checkpoints.resume import NO_CHECKPOINT, Chosen
from project.commands import COMMANDS
from project.errors import UserError


def refuse_unknown_weights(command: str, model: L.LightningModule, chosen: Chosen | None, asked: str | None) -> None:
    """Refuse to evaluate freshly initialised weights unless asked (or the module set ``weights_from`` itself)."""
    evaluates = COMMANDS[command].evaluates  # fit trains the weights it builds
    if not evaluates or chosen is not None or asked == NO_CHECKPOINT or getattr(model, "weights_from", None):
        return
    raise UserError(
        f"{command} without --ckpt_path would evaluate the freshly initialised weights of "
        f"{type(model).__name__}; give --ckpt_path PATH (or `last`: the newest of this run name), or "
        f"--ckpt_path {NO_CHECKPOINT} to evaluate the initial weights on purpose"
    )


def refuse_mismatched_checkpoint(chosen: Chosen | None, model: L.LightningModule, trainer: L.Trainer) -> None:
    """A checkpoint of another model than the config builds is one line; a good one is handed to Lightning.

    Layers built in ``configure_model`` exist only once the Trainer called it: such a module is compared right after,
    when Lightning reads the checkpoint (:meth:`AtomicCheckpointIO.preload`'s check).
    """
    if chosen is None or chosen.checkpoint is None:
        return
    io = trainer.strategy.checkpoint_io
    deferred = is_overridden("configure_model", model) and isinstance(io, AtomicCheckpointIO)
    if not deferred:
        _refuse_other_model(chosen, model, chosen.checkpoint)
    if isinstance(io, AtomicCheckpointIO):  # Lightning gets it without reading the file again
        io.preload(chosen.path, chosen.checkpoint, partial(_refuse_other_model, chosen, model) if deferred else None)


def _refuse_other_model(chosen: Chosen, model: L.LightningModule, checkpoint: dict) -> None:
    if diff := diff_state_dicts(checkpoint["state_dict"], model.state_dict()):
        run_config = Path(chosen.path).resolve().parent.parent / "config.yaml"
        config = f"--config {run_config}" if run_config.is_file() else "the config it was trained with"
        raise UserError(
            f"--ckpt_path '{chosen.path}' is a checkpoint of another model than the config builds "
            f"({diff.describe()}; shapes are checkpoint vs config); run it with {config}"
        )
