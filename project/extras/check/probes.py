"""The collective probes of ``check``: where each rank runs, known values, a barrier, latency and bandwidth.

Every function is called by every rank in the same order (they are collectives) and works on one
process too, where there is nothing to exchange.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from project.parallel.collectives import gather_objects, process_group_size
from project.parallel.ddp import synchronize

#: Message sizes of the bandwidth probe, in bytes: a latency-bound one, then ever more bandwidth-bound ones.
SIZES = (4, 256 * 1024, 4 * 1024**2, 16 * 1024**2)
#: Timed repetitions per size (after one untimed warm-up): enough for a stable mean, under a second on CPU.
REPEATS = {4: 50, 256 * 1024: 20, 4 * 1024**2: 5, 16 * 1024**2: 3}


@dataclass(frozen=True)
class Place:
    """Where one rank runs."""

    rank: int
    host: str
    device: str
    pid: int

    def describe(self) -> str:
        """``rank 1 (host gpu-node-3, device cuda:1)``: what a failure line names."""
        return f"rank {self.rank} (host {self.host}, device {self.device})"


def places(device: torch.device) -> list[Place]:
    """Every rank's place, in rank order (one gather)."""
    rank = dist.get_rank() if process_group_size() > 1 else 0
    mine = asdict(Place(rank, socket.gethostname(), str(device), os.getpid()))
    return [Place(**place) for place in gather_objects(mine)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wrong_values(device: torch.device, offset: float = 0.0) -> tuple[list[int], float, float]:
    """Ranks whose all-gathered value is not ``rank + 1``, and the all-reduced sum beside the expected one.

    Each rank contributes ``rank + 1 + offset`` (``offset`` is the fault drill's wrong value, 0 otherwise).
    The gather names the rank whose value arrives wrong; the sum checks the reduction itself.
    """
    size = process_group_size()
    rank = dist.get_rank() if size > 1 else 0
    mine = torch.tensor([rank + 1.0 + offset], dtype=torch.float32, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(size)]
    if size > 1:
        dist.all_gather(gathered, mine)
    else:
        gathered = [mine]
    total = mine.clone()
    if size > 1:
        dist.all_reduce(total)
    wrong = [r for r, value in enumerate(gathered) if float(value.item()) != r + 1.0]
    return wrong, float(total.item()), size * (size + 1) / 2


def barrier_wait(timeout_s: float) -> float:
    """Seconds this rank waited at a monitored barrier (a missing rank is named by :func:`synchronize`)."""
    return synchronize("check", timeout_s)


@dataclass(frozen=True)
class Bandwidth:
    """All-reduce of one message size: mean time and bus bandwidth (the nccl-tests convention)."""

    bytes: int
    time_us: float
    busbw_gbps: float


def all_reduce_bandwidth(device: torch.device, sizes: tuple[int, ...] = SIZES) -> list[Bandwidth]:
    """Time ``all_reduce`` of float32 tensors of each size; empty on one process.

    Bus bandwidth is ``bytes * 2 (n - 1) / n / time``: what each link carries in a ring all-reduce, so
    numbers are comparable across world sizes and with nccl-tests.
    """
    size = process_group_size()
    if size == 1:
        return []
    rows = []
    for nbytes in sizes:
        tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        dist.all_reduce(tensor)  # warm-up: connections and buffers for this size
        _sync(device)
        start = time.perf_counter()
        for _ in range(REPEATS.get(nbytes, 3)):
            dist.all_reduce(tensor)
        _sync(device)
        seconds = (time.perf_counter() - start) / REPEATS.get(nbytes, 3)
        busbw = tensor.numel() * 4 * 2 * (size - 1) / size / seconds / 1e9
        rows.append(Bandwidth(tensor.numel() * 4, seconds * 1e6, busbw))
    return rows
