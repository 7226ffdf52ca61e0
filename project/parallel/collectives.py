"""Small collectives the template's own code shares (never per step: pickled objects cost a round trip)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def in_process_group() -> bool:
    """Whether this process joined a default process group (torch built with distributed support, initialised)."""
    return dist.is_available() and dist.is_initialized()


def process_group_size() -> int:
    """The world size of the initialised default process group, or 1 without one."""
    return dist.get_world_size() if in_process_group() else 1


def gather_objects(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (just ``[value]`` on one process)."""
    size = process_group_size()
    if size == 1:
        return [value]
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, value)
    return gathered
