"""The batch math in one place: per-device batch x data-parallel size x accumulation = global batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from project.errors import UserError
from project.plan.config import ParallelConfig
from project.plan.layout import Layout
from project.plan.scenarios import SCENARIOS


@dataclass(frozen=True)
class BatchSizes:
    """Samples per micro-batch on one process and per optimizer step (``None`` until known), and the accumulation."""

    per_device: int | None
    global_: int | None
    accumulation: int = 1


def nearest_multiples(value: int, step: int) -> list[int]:
    """The multiples of ``step`` just below and above ``value`` (positive ones only)."""
    below = (value // step) * step
    return [m for m in (below, below + step) if m > 0]


def _split(global_: int, parts: int, name: str, what: str) -> int:
    """``global_ / parts``, or a one-line error with the nearest values that divide."""
    if global_ % parts:
        valid = " or ".join(str(m) for m in nearest_multiples(global_, parts))
        raise UserError(f"{name}={global_} does not divide by {what}; use {valid}, or change devices")
    return global_ // parts


def per_device_request(per_device_batch_size: int | None, micro_batch: int | str | None) -> int | None:
    """``per_device_batch_size``, or ``micro_batch`` (its other name; ``auto`` is the microbatch layer's)."""
    if micro_batch == "auto":
        raise UserError(
            "parallel.micro_batch=auto needs the microbatch layer (project/extras/microbatch), which this checkout "
            "does not have; give an integer"
        )
    if isinstance(micro_batch, str) or (micro_batch is not None and micro_batch < 1):
        raise UserError(f"parallel.micro_batch={micro_batch!r} must be a number of samples >= 1")
    if micro_batch is not None and per_device_batch_size not in (None, micro_batch):
        raise UserError(
            f"parallel.micro_batch={micro_batch} and parallel.per_device_batch_size={per_device_batch_size} are two "
            "names of one setting with two values; keep one"
        )
    return micro_batch if micro_batch is not None else per_device_batch_size


def resolve_batch(
    data_batch_is_global: bool,
    global_batch_size: int | None,
    data_batch_size: int | None,
    dp_size: int,
    per_device_batch_size: int | None = None,
    accumulation: int | None = None,
    size_name: str = "world size",
    micro_batch: int | str | None = None,
) -> BatchSizes:
    """(per-device, global, accumulation): any two given decide the third, else the loader's batch size decides.

    The loader's batch is per device, or global where ``data_batch_is_global`` (``dp``); ``dp_size``: the processes
    that train on different data, called ``size_name`` in messages.
    """
    per_device_batch_size = per_device_request(per_device_batch_size, micro_batch)
    given = {"parallel.global_batch_size": global_batch_size, "parallel.per_device_batch_size": per_device_batch_size}
    given |= {"parallel.accumulation": accumulation, "data batch_size": data_batch_size}
    for name, value in given.items():
        if value is not None and value < 1:
            raise UserError(f"{name}={value} must be >= 1")
    from_data = global_batch_size is None and data_batch_is_global and per_device_batch_size is None
    if from_data:
        global_batch_size = data_batch_size  # DataParallel's meaning: the loader's batch is split
    if global_batch_size is None:
        per_device = per_device_batch_size if per_device_batch_size is not None else data_batch_size
        accumulation = accumulation or 1
        return BatchSizes(per_device, None if per_device is None else per_device * dp_size * accumulation, accumulation)
    name = "data batch_size (global under dp)" if from_data else "parallel.global_batch_size"
    return _from_global(global_batch_size, name, dp_size, per_device_batch_size, accumulation, size_name)


def _from_global(
    global_: int, name: str, dp_size: int, per_device: int | None, accumulation: int | None, size_name: str
) -> BatchSizes:
    """(per-device, global, accumulation) when the global batch is given: the other two divide it."""
    if per_device is not None and accumulation is not None:
        if per_device * dp_size * accumulation != global_:
            raise UserError(
                f"parallel.global_batch_size={global_} is not per_device_batch_size "
                f"{per_device} x {size_name} {dp_size} x accumulation {accumulation} "
                f"(= {per_device * dp_size * accumulation}); give two of the three"
            )
        return BatchSizes(per_device, global_, accumulation)
    if per_device is not None:
        per_step = per_device * dp_size
        what = f"per_device_batch_size {per_device} x {size_name} {dp_size} = {per_step}"
        return BatchSizes(per_device, global_, _split(global_, per_step, name, what))
    accumulation = accumulation or 1
    what = f"the {size_name} {dp_size}" + (f" x accumulation {accumulation}" if accumulation > 1 else "")
    return BatchSizes(_split(global_, dp_size * accumulation, name, what), global_, accumulation)


@dataclass(frozen=True)
class BatchRequest:
    """What the ``parallel`` section asked of the batch: completed by the loader's batch size."""

    global_batch_size: int | None = None
    per_device_batch_size: int | None = None
    accumulation: int | None = None
    micro_batch: int | str | None = None

    @classmethod
    def of(cls, config: ParallelConfig) -> BatchRequest:
        """The request of the ``parallel`` section."""
        return cls(config.global_batch_size, config.per_device_batch_size, config.accumulation, config.micro_batch)


def _batch_notes(global_data: bool, batch: BatchSizes) -> list[str]:
    """What the plan says about its batch: dp's split, the accumulation."""
    notes: list[str] = []
    if global_data and batch.global_ is not None:
        notes.append(
            "dp runs as DDP (Lightning removed DataParallel): one process per GPU instead of threads; "
            f"the global batch {batch.global_} is split into {batch.per_device} per GPU, as DataParallel's scatter did"
        )
    if batch.accumulation > 1:
        notes.append(
            f"gradient accumulation: {batch.accumulation} micro-batches of {batch.per_device} per process make one "
            f"optimizer step of {batch.global_}; DDP all-reduces on the last micro-batch only"
        )
    return notes


def batch_fields(
    layout: Layout, request: BatchRequest, data_batch_size: int | None
) -> tuple[dict[str, Any], list[str]]:
    """The plan's batch fields for ``data_batch_size``, and the notes that explain them."""
    global_data = SCENARIOS[layout.scenario].data_batch_is_global
    asked = (request.global_batch_size, data_batch_size, layout.dp_size, request.per_device_batch_size)
    batch = resolve_batch(global_data, *asked, request.accumulation, layout.dp_size_name, request.micro_batch)
    fields = {"micro_batch": batch.per_device, "per_device_batch_size": batch.per_device}
    fields |= {"global_batch_size": batch.global_, "accumulation": batch.accumulation}
    return fields, _batch_notes(global_data, batch)
