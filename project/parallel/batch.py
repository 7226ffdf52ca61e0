"""The batch math in one place: per-device batch x world size = global batch."""

from __future__ import annotations

from dataclasses import dataclass

from project.errors import UserError


@dataclass(frozen=True)
class BatchSizes:
    """Samples per process per step and over all processes (``None`` while the data batch is unknown)."""

    per_device: int | None
    global_: int | None


def nearest_multiples(value: int, step: int) -> list[int]:
    """The multiples of ``step`` just below and above ``value`` (positive ones only)."""
    below = (value // step) * step
    return [m for m in (below, below + step) if m > 0]


def resolve_batch(
    scenario: str, global_batch_size: int | None, data_batch_size: int | None, world_size: int
) -> BatchSizes:
    """(per-device, global) batch sizes; dp reads the data batch size as global, the others as per device.

    ``data_batch_size`` is the batch size of the training loader the datamodule returns.

    Raises:
        UserError: a size below 1, or a global batch that does not divide by the world size.
    """
    for name, value in (("parallel.global_batch_size", global_batch_size), ("data batch_size", data_batch_size)):
        if value is not None and value < 1:
            raise UserError(f"{name}={value} must be >= 1")
    target = global_batch_size if global_batch_size is not None else (data_batch_size if scenario == "dp" else None)
    if target is None:
        return BatchSizes(data_batch_size, None if data_batch_size is None else data_batch_size * world_size)
    if target % world_size:
        valid = " or ".join(str(m) for m in nearest_multiples(target, world_size))
        name = "parallel.global_batch_size" if global_batch_size is not None else "data batch_size (global under dp)"
        raise UserError(
            f"{name}={target} does not divide by the world size {world_size}; use {valid}, or change devices"
        )
    return BatchSizes(target // world_size, target)
