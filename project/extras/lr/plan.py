"""The plan's learning rate: ``parallel.learning_rate`` checked, and its factor, rates and note in every plan.

The factor depends on the global batch, which the training loader's batch size may decide only inside the ranks;
so the layer's ``on_state`` hook (:func:`take_learning_rate`) checks the subsection before any plan is resolved
and amends every plan the run makes (:meth:`project.run_state.RunState.amend`): plan.json's ``learning_rate``
entry and, with a scaling, its note.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from project.errors import UserError
from project.extras.lr.config import LearningRate
from project.plan.resolve import Plan
from project.run_state import RunState

#: The start of the plan's note on a scaling (a plan amended again drops its old note first).
NOTE_START = "learning rates x "


def lr_factor(rule: str, global_batch_size: int | None, reference_batch_size: int | None) -> float | None:
    """The learning-rate multiplier of ``rule`` (none | linear | sqrt); ``None`` while the global batch is unknown.

    Raises:
        UserError: a rule without a reference batch size, or sizes below 1.
    """
    if rule == "none":
        return 1.0
    if reference_batch_size is None or reference_batch_size < 1:
        raise UserError(
            f"parallel.learning_rate.lr_scaling={rule!r} needs parallel.learning_rate.reference_batch_size >= 1 "
            f"(the global batch the learning rate was tuned for), got {reference_batch_size}"
        )
    if global_batch_size is None:
        return None
    ratio = global_batch_size / reference_batch_size
    return ratio if rule == "linear" else ratio**0.5


def check(options: LearningRate) -> None:
    """The subsection holds before any plan is made.

    Raises:
        UserError: a negative warmup, or a scaling without a reference batch size of at least 1.
    """
    if options.warmup_steps < 0:
        raise UserError(f"parallel.learning_rate.warmup_steps={options.warmup_steps} must be >= 0")
    lr_factor(options.lr_scaling, None, options.reference_batch_size)


def configured_lr(config: Any) -> float | None:
    """The learning rate of the config's ``optimizer:`` section, if it has one."""
    optimizer = config.get("optimizer") if config is not None else None
    init_args = optimizer.get("init_args") if optimizer is not None else None
    lr = init_args.get("lr") if init_args is not None else None
    return float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None


def take_learning_rate(state: RunState, config: Any) -> None:
    """The layer's ``on_state`` hook: checks ``parallel.learning_rate`` and puts its entry in every plan.

    Raises:
        UserError: the subsection cannot hold (:func:`check`).
    """
    if state.section is None:
        return  # parallel: null (plain Lightning): no plan
    options = state.section.learning_rate
    check(options)
    state.amend(with_learning_rate(options, configured_lr(config)))


def with_learning_rate(options: LearningRate, configured: float | None) -> Callable[[Plan], Plan]:
    """The change to a plan: its ``learning_rate`` entry for its global batch, and the note on a scaling."""

    def change(plan: Plan) -> Plan:
        factor = lr_factor(options.lr_scaling, plan.global_batch_size, options.reference_batch_size)
        entry = {
            "scaling": options.lr_scaling,
            "reference_batch_size": options.reference_batch_size,
            "factor": factor,
            "warmup_steps": options.warmup_steps,
            "lr": None
            if configured is None or factor is None
            else {"configured": configured, "scaled": configured * factor},
        }
        notes = tuple(note for note in plan.notes if not note.startswith(NOTE_START))
        if options.lr_scaling != "none" and factor is not None:
            notes += (
                f"{NOTE_START}{factor:g} ({options.lr_scaling}: global batch {plan.global_batch_size} against the "
                f"reference {options.reference_batch_size})",
            )
        return replace(plan, records={**plan.records, "learning_rate": entry}, notes=notes)

    return change
