"""Test-only pieces for ``micro_batch: auto``: a network whose activations grow with the batch, and a memory cap.

- :class:`BroadNet`: 64 features -> ``hidden`` -> every hidden unit repeated ``repeat`` times -> 10 logits. Its
  parameters are small, its activations ``hidden x repeat`` floats per sample, so what fits depends on the
  micro-batch (no BatchNorm: the result must not depend on it).
- :class:`SpikyNet`: a :class:`BroadNet` whose training forwards on one rank, after the first ``after``, need more
  memory than there is whenever they hold more than ``above`` samples: a data-dependent spike in mid-run. The
  allocation that fails is real (16 TiB: ``DefaultCPUAllocator: can't allocate memory``).
- :class:`AddressSpaceLimit`: caps this process's address space (``RLIMIT_AS``) at ``on_fit_start`` to what it
  maps then plus ``headroom_mb``, on the listed ranks only (``None``: all), for the micro-batch search: a larger
  allocation fails with the CPU's real out-of-memory error (``DefaultCPUAllocator: can't allocate memory``). The
  cap is lifted when training starts: glibc keeps freed blocks of up to 32 MB mapped after the trials, so the
  address space a step then counts is not the memory it uses.

Plugged in by class path (``tests/`` is on PYTHONPATH for CLI runs).
"""

from __future__ import annotations

import resource

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor, nn


class BroadNet(nn.Module):
    """An MLP whose hidden layer is repeated ``repeat`` times before the output layer reads it."""

    def __init__(self, hidden: int = 64, repeat: int = 4096, num_classes: int = 10, in_features: int = 64) -> None:
        super().__init__()
        self.repeat = repeat
        self.inp = nn.Linear(in_features, hidden)
        self.out = nn.Linear(hidden * repeat, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits."""
        return self.out(torch.relu(self.inp(x)).repeat(1, self.repeat))


class SpikyNet(BroadNet):
    """:class:`BroadNet` out of memory on rank ``rank`` after ``after`` training forwards of over ``above`` samples."""

    def __init__(self, rank: int = 0, after: int = 2, above: int = 16, **broad: int) -> None:
        super().__init__(**broad)
        self.rank, self.after, self.above = rank, after, above
        self._forwards = 0

    def forward(self, x: Tensor) -> Tensor:
        """Logits; the spike first."""
        if self.training and torch.is_grad_enabled():
            self._forwards += 1
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            if rank == self.rank and self._forwards > self.after and x.shape[0] > self.above:
                torch.empty(2**44, dtype=torch.uint8)  # fails: what a spike beyond the device's memory does
        return super().forward(x)


def _mapped_bytes() -> int:
    """This process's address space now (``VmSize``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


class AddressSpaceLimit(L.Callback):
    """Cap the address space of the listed ranks for the micro-batch search (``on_fit_start`` to training)."""

    def __init__(self, headroom_mb: int = 100, ranks: list[int] | None = None) -> None:
        self.headroom_mb = headroom_mb
        self.ranks = ranks
        self._before: tuple[int, int] | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Set ``RLIMIT_AS`` to what is mapped now plus the headroom, on this rank if it is listed."""
        if self.ranks is None or trainer.global_rank in self.ranks:
            limit = _mapped_bytes() + self.headroom_mb * 2**20
            self._before = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (limit, self._before[1]))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Lift the cap (the search is over)."""
        if self._before is not None:
            resource.setrlimit(resource.RLIMIT_AS, self._before)
