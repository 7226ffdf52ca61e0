"""``parallel.micro_batch: auto`` in the plan: the sizes it tries, what it fixes before the search, what it refuses.

To the core's batch arithmetic ``auto`` is an unset per-device batch at an accumulation of 1: one whole step of each
process, the global batch fixed. So the layer takes ``auto`` off the section before the core resolves it
(:func:`take_auto`, its ``on_state`` hook) and amends every plan the run makes (:func:`starting`): it says
``micro_batch: auto``, which sizes the search will try, and that the template splits each step itself, and refuses
a layout ``auto`` cannot run. Once the search picked (:mod:`.search`), :func:`picked` sets the per-device batch and
the accumulation that make up the same global batch, while the training loader still hands whole steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from project.errors import UserError
from project.plan.resolve import Plan
from project.run_state import RunState

#: ``parallel.micro_batch``'s value that searches the largest micro-batch that fits (:mod:`.search`).
AUTO = "auto"


def micro_batch_candidates(per_device_step: int) -> list[int]:
    """The micro-batches ``auto`` tries, largest first.

    Each is the largest divisor of ``per_device_step`` at most half the one before: at most
    ``log2(per_device_step) + 1`` trials, and every one keeps the global batch whole.
    """
    found = [per_device_step]
    while found[-1] > 1:
        half = found[-1] // 2
        found.append(max(d for d in range(1, half + 1) if per_device_step % d == 0))
    return found


def take_auto(state: RunState, config: Any) -> None:
    """The layer's ``on_state`` hook: under ``micro_batch: auto``, the section the core resolves, every plan's change.

    Raises:
        UserError: ``auto`` beside an explicit per-device batch or accumulation.
    """
    section = state.section
    if section is None or section.micro_batch != AUTO:
        return
    asked = (("per_device_batch_size", section.per_device_batch_size), ("accumulation", section.accumulation))
    given = [f"{name}={value}" for name, value in asked if value is not None]
    if given:
        raise UserError(
            f"parallel.micro_batch='auto' picks the per-device batch and the accumulation itself, but "
            f"parallel.{' and parallel.'.join(given)} is set too; drop it, or set parallel.micro_batch to a number"
        )
    state.section = replace(section, micro_batch=None)  # one whole step per process, at an accumulation of 1
    state.amend(starting)


def starting(plan: Plan) -> Plan:
    """``plan`` under ``auto`` before the search: ``micro_batch: auto``, the sizes it will try, whole steps split here.

    Raises:
        UserError: a layout ``auto`` cannot run (:func:`refuse_auto`).
    """
    refuse_auto(plan)
    auto = replace(plan, micro_batch=AUTO, splits_in_step=True)
    if plan.per_device_batch_size is None:  # the data batch is not known yet
        return auto
    note = (
        f"micro-batch auto: the largest of {', '.join(map(str, micro_batch_candidates(plan.per_device_batch_size)))} "
        f"that fits on every rank, found by trial steps at the start of fit; the global batch stays "
        f"{plan.global_batch_size} and the accumulation is {plan.per_device_batch_size} / micro-batch"
    )
    return replace(auto, notes=(note, *plan.notes))


def picked(micro: int, trials: tuple[tuple[int, bool], ...]) -> Callable[[Plan], Plan]:
    """The change the search's pick makes to a plan under ``auto``: ``micro`` samples per forward and backward.

    The same global batch, the accumulation that makes it up, and the search's note (``trials``: the sizes tried,
    and whether each fitted) in place of the one that said it was to come; ``micro_batch_trials`` in plan.json.
    """

    def pick(plan: Plan) -> Plan:
        assert plan.per_device_batch_size is not None and plan.per_device_batch_size % micro == 0
        accumulation = plan.per_device_batch_size // micro
        tried = ", ".join(f"{size} {'fits' if fitted else 'does not'}" for size, fitted in trials)
        note = (
            f"micro-batch auto picked {micro} per process ({tried}): {micro} x {plan.dp_size} x accumulation "
            f"{accumulation} = global batch {plan.global_batch_size}"
        )
        notes = tuple(n for n in plan.notes if not n.startswith("micro-batch auto:"))
        return replace(
            plan,
            per_device_batch_size=micro,
            accumulation=accumulation,
            micro_batch=micro,
            records={**plan.records, "micro_batch_trials": trials},
            notes=(note, *notes),
        )

    return pick


def refuse_auto(plan: Plan) -> None:
    """``micro_batch: auto`` only where a micro-batch's step needs no collective, and without a loss scaler.

    A sharded step gathers and reduces inside the forward and backward, so a rank out of memory there would leave
    the others waiting. ``16-mixed`` scales each backward's loss by a GradScaler, which the template's own split
    of a step into micro-batches does not apply.

    Raises:
        UserError: ``auto`` under a strategy that shards parameters or optimizer state, or with ``16-mixed``.
    """
    if plan.row.shards_parameters or plan.row.shards_optimizer_state:
        raise UserError(
            f"parallel.micro_batch='auto' is for scenarios whose micro-batches run without collectives (cpu, ddp, "
            f"dp, single); scenario {plan.scenario!r} shards across processes: set parallel.micro_batch to a number"
        )
    if plan.precision == "16-mixed":
        raise UserError(
            "parallel.micro_batch='auto' with parallel.precision='16-mixed': the float16 loss scaler is not applied "
            "to the micro-batches the template splits a step into; use precision bf16-mixed, or set "
            "parallel.micro_batch to a number"
        )
