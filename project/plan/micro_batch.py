"""``parallel.micro_batch``: its ``auto`` value, the sizes ``auto`` tries, and how it reads beside the other fields.

Pure batch arithmetic for :mod:`project.plan.batch`; the search itself runs in the ranks
(:mod:`project.callbacks.micro_batch`, :mod:`project.parallel.split_step`).
"""

from __future__ import annotations

from project.errors import UserError
from project.plan.config import ParallelConfig
from project.plan.strategies import StrategyRow

#: ``parallel.micro_batch``'s value that searches the largest micro-batch that fits (project.parallel.micro_batch).
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


def per_device_request(
    per_device_batch_size: int | None, micro_batch: int | str | None, accumulation: int | None
) -> tuple[int | None, int | None, bool]:
    """``per_device_batch_size`` as the section asks it, with ``micro_batch`` (its other name, or ``auto``).

    Returns ``(per_device, accumulation, auto)``; under ``auto`` both are left to the search (``None``).

    Raises:
        UserError: ``auto`` beside an explicit per-device batch or accumulation, or two different sizes.
    """
    if micro_batch == AUTO:
        given = [
            f"{name}={value}"
            for name, value in (("per_device_batch_size", per_device_batch_size), ("accumulation", accumulation))
            if value is not None
        ]
        if given:
            raise UserError(
                f"parallel.micro_batch='auto' picks the per-device batch and the accumulation itself, but "
                f"parallel.{' and parallel.'.join(given)} is set too; drop it, or set parallel.micro_batch to a number"
            )
        return None, None, True
    if isinstance(micro_batch, str) or (micro_batch is not None and micro_batch < 1):
        raise UserError(f"parallel.micro_batch={micro_batch!r} must be 'auto' or a number of samples >= 1")
    if micro_batch is not None and per_device_batch_size not in (None, micro_batch):
        raise UserError(
            f"parallel.micro_batch={micro_batch} and parallel.per_device_batch_size={per_device_batch_size} are two "
            "names of one setting with two values; keep one"
        )
    return micro_batch if micro_batch is not None else per_device_batch_size, accumulation, False


def refuse_auto(config: ParallelConfig, row: StrategyRow) -> None:
    """``micro_batch: auto`` only where a micro-batch's step needs no collective, and without a loss scaler.

    A sharded step gathers and reduces inside the forward and backward, so a rank out of memory there would leave
    the others waiting. ``16-mixed`` scales each backward's loss by a GradScaler, which the template's own split
    of a step into micro-batches does not apply.

    Raises:
        UserError: ``auto`` under a strategy that shards parameters or optimizer state, or with ``16-mixed``.
    """
    if config.micro_batch != AUTO:
        return
    if row.shards_parameters or row.shards_optimizer_state:
        raise UserError(
            f"parallel.micro_batch='auto' is for scenarios whose micro-batches run without collectives (cpu, ddp, "
            f"dp, single); scenario {config.scenario!r} shards across processes: set parallel.micro_batch to a number"
        )
    if config.precision == "16-mixed":
        raise UserError(
            "parallel.micro_batch='auto' with parallel.precision='16-mixed': the float16 loss scaler is not applied "
            "to the micro-batches the template splits a step into; use precision bf16-mixed, or set "
            "parallel.micro_batch to a number"
        )
