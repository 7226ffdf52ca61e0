"""Small collectives the template's own code shares (never per step: pickled objects cost a round trip)."""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from project.lightning_private import default_store

#: How long rank 0 waits for the other ranks to have left before it leaves (and its rendezvous store with it).
LEAVE_WAIT_S = 30.0


def in_process_group() -> bool:
    """Whether this process joined a default process group (torch built with distributed support, initialised)."""
    return dist.is_available() and dist.is_initialized()


def process_group_size() -> int:
    """The world size of the initialised default process group, or 1 without one."""
    return dist.get_world_size() if in_process_group() else 1


def gather_objects(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (just ``[value]`` on one process)."""
    if (size := process_group_size()) == 1:
        return [value]
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, value)
    return gathered


def store_client(timeout_s: float) -> dist.TCPStore:
    """A new client of the rendezvous store (no collective); one per thread: a client holds its lock while it waits."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def leave_together() -> None:
    """Leave the default process group on every rank, rank 0 (which hosts the rendezvous store) last.

    Rank 0 leaving while another rank still tore its connections down aborted that rank ("terminate called without
    an active exception") after a successful run; a barrier alone does not order the teardowns, the store does.
    """
    if not in_process_group():
        return
    store, rank, world = default_store(), dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if rank != 0:
        dist.destroy_process_group()
        with contextlib.suppress(RuntimeError):  # the store client outlives the group: this reference holds it
            store.set(f"project/left/{rank}", "1")
        return
    # A rank that could not say it left (its store connection broke) is not waited for past the timeout.
    with contextlib.suppress(RuntimeError):
        store.wait([f"project/left/{other}" for other in range(1, world)], timedelta(seconds=LEAVE_WAIT_S))
    dist.destroy_process_group()
