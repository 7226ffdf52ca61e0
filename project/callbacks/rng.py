"""Every rank's own state in each checkpoint (random generators, rank-local buffers), one checkpoint for all ranks.

Lightning saves no random generators, so a resumed dropout would draw other numbers than the uninterrupted run; and
it saves rank 0's buffers only, which under ``broadcast_buffers: false`` are rank 0's statistics, not the others'.
They are put back after Lightning built the data iterator (which may draw a seed from them).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from project.errors import UserError
from project.parallel.collectives import gather_objects


def _rng_state() -> dict[str, Any]:
    """This process's generators as plain values: they travel between ranks as objects and load with weights_only."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state().numpy().tobytes(),
        "cuda": [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "python": random.getstate(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in state["cuda"]])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def rank_local_buffers(trainer: L.Trainer | None, module: nn.Module) -> dict[str, torch.Tensor] | None:
    """This rank's buffers when each rank keeps its own (DDP with ``broadcast_buffers`` off, several processes)."""
    wrapper = trainer.strategy.model if trainer is not None else None
    if not isinstance(wrapper, DistributedDataParallel) or wrapper.broadcast_buffers or trainer.world_size == 1:
        return None
    return {name: buffer.detach().cpu().clone() for name, buffer in module.named_buffers()}


def derived_seed(step: int, rank: int) -> int:
    """A seed of its own for each (step, rank), the same whenever a run resumes at that step on that rank."""
    return (step * 1_000_003 + rank * 7_919 + 1) % 2**32


class RandomStateCallback(L.Callback):
    """Save and restore every rank's random state; check that all ranks resume from ``ckpt_path`` (``None``: new)."""

    def __init__(self, ckpt_path: str | None = None) -> None:
        self.ckpt_path = ckpt_path
        self._to_restore: list[dict[str, Any]] | None = None
        self._buffers: list[dict[str, torch.Tensor]] | None = None
        self._trainer: L.Trainer | None = None  # state_dict() gets no trainer argument

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Refuse to start when the ranks were given different checkpoints (every rank raises the same error)."""
        self._trainer = trainer
        paths = gather_objects(self.ckpt_path)
        if len(set(paths)) > 1:
            listed = ", ".join(f"rank {rank}: {path or 'none (new run)'}" for rank, path in enumerate(paths))
            raise UserError(
                f"the ranks would start from different checkpoints ({listed}); every node must see the same "
                "logs/ folder (a shared filesystem), or give the same --ckpt_path PATH to every node"
            )

    def state_dict(self) -> dict[str, Any]:
        """The random state (and rank-local buffers) of every rank (collectives: Lightning dumps on all ranks)."""
        state = {"rng": gather_objects(_rng_state()) if self._trainer is not None else [_rng_state()]}
        trainer = self._trainer
        if trainer is not None and (own := rank_local_buffers(trainer, trainer.lightning_module)) is not None:
            state["buffers"] = gather_objects(own)  # the model's state holds rank 0's only
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the saved random states (and rank-local buffers) until training starts."""
        self._to_restore = state_dict.get("rng")
        self._buffers = state_dict.get("buffers")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Put this rank's saved generators back; on another world size, seed them from the step and the rank."""
        states, self._to_restore = self._to_restore, None
        buffers, self._buffers = self._buffers, None
        if buffers and len(buffers) == trainer.world_size:  # else every rank goes on from rank 0's (the model's)
            own = buffers[trainer.global_rank]
            for name, buffer in pl_module.named_buffers():
                if name in own:
                    buffer.copy_(own[name])
        if not states:
            return
        if len(states) == trainer.world_size:
            _set_rng_state(states[trainer.global_rank])
            return
        seed = derived_seed(trainer.global_step, trainer.global_rank)
        torch.manual_seed(seed)  # CUDA too
        np.random.seed(seed)
        random.seed(seed)
        if trainer.is_global_zero:
            sys.stderr.write(
                f"warning: resuming a checkpoint of {len(states)} process(es) on {trainer.world_size}: the data "
                "order continues exactly; per-rank random state (dropout) is re-derived from the step and the rank\n"
            )
