"""``parallel.compile: true``: ``torch.compile`` applied after the strategy has wrapped the model.

Given a compiled LightningModule, Lightning's Trainer unwraps it and compiles only its step methods; Fabric
compiles again over the DDP wrapper. Here the networks inside the LightningModule (its direct children that
hold parameters, e.g. ``Classifier.net``) are compiled *in place* with :meth:`torch.nn.Module.compile`, once
the strategy has set the model up (DDP or FSDP wrap, device move):

- no wrapper object appears: the module tree, ``trainer.lightning_module``, checkpoints and ``export/model.pt``
  keep their plain keys (no ``_orig_mod.``), and a deep copy (the export of the best checkpoint) is eager;
- the compiled networks run inside DDP's forward, so TorchDynamo's DDP optimizer splits their graphs at
  DDP's bucket boundaries and the gradient all-reduce still overlaps the backward;
- under FSDP the wrapped units are already in place when their parent network is compiled;
- the LightningModule itself stays eager: its ``training_step`` logs and calls Python hooks, and Lightning
  re-patches its ``forward`` on every step, which would make a compiled LightningModule recompile every step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import lightning as L
from torch import nn

from project.errors import UserError
from project.extras.compile.lightning_private import compiled_call
from project.plan.resolve import Plan
from project.run_state import RunState


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` was compiled in place (:meth:`torch.nn.Module.compile`)."""
    return compiled_call(module) is not None


def networks(module: nn.Module) -> dict[str, nn.Module]:
    """The direct children of ``module`` that hold parameters: the networks a LightningModule trains."""
    return {name: child for name, child in module.named_children() if any(True for _ in child.parameters())}


def compile_after_wrap(module: nn.Module, **compile_kwargs: object) -> list[str]:
    """Compile the networks of ``module`` (a LightningModule) in place; call it after the strategy's wrap.

    Idempotent: a network compiled already is left as it is, so a strategy may call this from its own setup
    and :class:`CompileAfterWrap` again without compiling twice. ``compile_kwargs`` go to ``torch.compile``
    (default: its default backend, inductor).

    Returns:
        The names of the compiled networks.

    Raises:
        UserError: ``module`` has no child module with parameters to compile.
    """
    found = networks(module)
    if not found:
        raise UserError(
            f"parallel.compile=true found no network in {type(module).__name__} to compile (no child module holds "
            "parameters); keep the network in an attribute (e.g. self.net = ...), or set parallel.compile false"
        )
    for child in found.values():
        if not is_compiled(child):
            child.compile(**compile_kwargs)
    return list(found)


class CompileAfterWrap(L.Callback):
    """Compile the LightningModule's networks in place once the strategy has set the model up.

    The Trainer calls ``strategy.setup`` (the DDP/FSDP wrap) before ``on_fit_start`` and before the start of
    ``validate``, ``test`` and ``predict``, so each of those hooks sees the wrapped model; the first compiles.
    Compilation itself happens on each network's first call (training, then again for evaluation mode).
    """

    def __init__(self) -> None:
        self.compiled: list[str] = []

    def _compile(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.compiled:
            return
        self.compiled = compile_after_wrap(pl_module)
        if trainer.is_global_zero:
            wrapper = type(trainer.strategy.model).__name__
            print(
                f"torch.compile: {', '.join(self.compiled)} of {type(pl_module).__name__} compiled in place after "
                f"{type(trainer.strategy).__name__} set up the model ({wrapper}); the first steps include compilation",
                flush=True,
            )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After the strategy's setup of ``fit`` (the DDP/FSDP wrap)."""
        self._compile(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``validate`` (during ``fit`` this is a no-op: ``on_fit_start`` compiled already)."""
        self._compile(trainer, pl_module)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``test``."""
        self._compile(trainer, pl_module)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``predict``."""
        self._compile(trainer, pl_module)


#: The plan's note under ``parallel.compile: true``.
NOTE = (
    "compile: torch.compile (inductor) is applied in place to the module's networks after the strategy "
    "wraps the model; the first training and evaluation steps include compilation"
)


def take_compile(state: RunState, config: Any) -> None:
    """The layer's ``on_state`` hook: takes ``compile: true`` off the section and puts it in every plan instead."""
    if state.section is not None and state.section.compile:
        state.section = replace(state.section, compile=False)  # the core refuses what no layer took
        state.amend(compiled)


def compiled(plan: Plan) -> Plan:
    """``plan`` that compiles: ``compile: true`` in plan.json, and the note after the setting notes."""
    notes = plan.notes if NOTE in plan.notes else (*plan.notes, NOTE)
    return replace(plan, records={**plan.records, "compile": True}, notes=notes)


def compile_callbacks(state: RunState, row: Any, config: Any) -> list[L.Callback]:
    """The layer's ``callbacks`` hook: :class:`CompileAfterWrap` for a run whose plan compiles."""
    plan = state.built
    return [CompileAfterWrap()] if plan is not None and plan.records.get("compile") else []
