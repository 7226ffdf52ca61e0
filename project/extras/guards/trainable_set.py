"""The trainable set (``requires_grad`` of each parameter) followed during fit and restored on resume.

During fit: a fine-tuning callback (Lightning's ``BackboneFinetuning``) or a user's own unfreezing changes which
parameters train after DDP was built; :mod:`.trainable` makes DDP all-reduce them from then on.
The check is a comparison of one tuple of booleans at each batch start and before each optimizer step.

On resume: the checkpoint holds the trainable set and the optimizers' parameter groups (by parameter name).
Lightning restores a fine-tuning callback's parameter groups but its ``setup`` freezes the backbone again, so a
run resumed after the unfreezing would train a frozen backbone; the saved set is put back as soon as the
checkpoint is read (before DDP is built), and parameter groups that differ from the saved ones stop the run in
one line before the optimizer state is loaded into the wrong parameters.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from project.errors import UserError
from project.extras.guards.trainable import (
    average_gradients,
    ddp_of,
    rebuild_ddp,
    trainable_mask,
    trainable_names,
)


def _group_names(pl_module: L.LightningModule, optimizers: list[Any]) -> list[list[list[str]]]:
    """The parameter names of each group of each optimizer."""
    names = {id(param): name for name, param in pl_module.named_parameters()}
    return [[[names.get(id(p), "?") for p in group["params"]] for group in opt.param_groups] for opt in optimizers]


def _describe_groups(groups: list[list[list[str]]]) -> str:
    """Groups as ``optimizer 0: [2 parameters: a, b], [1 parameter: c]`` (at most 2 names each)."""
    parts = []
    for index, optimizer in enumerate(groups):
        shown = [f"[{len(g)}: {', '.join(g[:2])}{', ...' if len(g) > 2 else ''}]" for g in optimizer]
        parts.append(f"optimizer {index}: {' '.join(shown)}")
    return "; ".join(parts)


class TrainableSetCallback(L.Callback):
    """All-reduce parameters made trainable during fit under DDP; keep the trainable set across a resume."""

    def __init__(self) -> None:
        self._module: L.LightningModule | None = None
        self._trainer: L.Trainer | None = None
        self._saved: dict[str, Any] | None = None
        self._wrapped: tuple[bool, ...] | None = None  # the trainable mask DDP was built with

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Remember the module: the checkpoint's trainable set is put back on it as soon as it is read."""
        self._module, self._trainer = pl_module, trainer

    def state_dict(self) -> dict[str, Any]:
        """The trainable parameters and the optimizers' parameter groups, by name."""
        if self._module is None or self._trainer is None:
            return {}
        groups = _group_names(self._module, self._trainer.optimizers)
        trainable = trainable_names(self._module)
        whole = getattr(self._trainer.strategy, "whole_training_set", None)
        if whole is not None:  # a pipeline stage holds part of the model: the checkpoint holds the whole one's
            trainable, groups = whole(trainable)
        return {"trainable": trainable, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Put the saved trainable set back (read after ``setup``, where a fine-tuning callback froze it again)."""
        if "trainable" not in state_dict:
            return
        self._saved = state_dict
        if self._module is not None:
            self._restore(self._module)

    def _restore(self, pl_module: L.LightningModule) -> None:
        assert self._saved is not None
        trainable = set(self._saved["trainable"])
        params = dict(pl_module.named_parameters())
        missing = sorted(trainable - set(params))
        if missing:
            raise UserError(
                f"the checkpoint trains parameter(s) {', '.join(missing[:3])} that {type(pl_module).__name__} does "
                "not have; resume with the module the checkpoint was trained with"
            )
        for name, param in params.items():
            param.requires_grad_(name in trainable)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Note what DDP was built with; after a resume, the parameter groups must be the checkpoint's."""
        self._wrapped = trainable_mask(pl_module)
        if (
            ddp_of(trainer.strategy) is None
        ):  # nothing to rebuild: the per-step hooks cost nothing (dispatch skips None)
            self.on_train_batch_start = self.on_before_optimizer_step = None  # type: ignore[assignment]
        if self._saved is None:
            return
        saved, now = self._saved["param_groups"], _group_names(pl_module, trainer.optimizers)
        whole = getattr(trainer.strategy, "whole_training_set", None)
        if whole is not None:  # a pipeline: its optimizers' groups before the cut (no collective: the names only)
            now = trainer.strategy.whole_parameter_groups
        if saved != now:
            raise UserError(
                f"the optimizers' parameter groups differ from the checkpoint's: it has {_describe_groups(saved)}, "
                f"this run {_describe_groups(now)}; a callback that adds parameter groups during fit must add them "
                "again on resume (Lightning's BaseFinetuning does, in on_fit_start)"
            )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """A changed trainable set before the forward: DDP is rebuilt around the new one."""
        mask = trainable_mask(pl_module)
        if mask != self._wrapped:
            self._wrapped = mask
            rebuild_ddp(trainer.strategy)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """A change after the forward: this step's newly trainable gradients averaged, then DDP rebuilt."""
        mask = trainable_mask(pl_module)
        if mask == self._wrapped:
            return
        ddp = ddp_of(trainer.strategy)
        if ddp is not None and self._wrapped is not None:
            params = list(pl_module.parameters())
            new = [p for p, now, before in zip(params, mask, self._wrapped) if now and not before]
            average_gradients(new, ddp)
        del ddp
        self._wrapped = mask
        rebuild_ddp(trainer.strategy)
