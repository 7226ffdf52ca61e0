"""The Lightning side of the record: a callback that stamps every optimizer step.

Added to plain Lightning by ``bench/plain.py`` and to the template on its command line
(``--trainer.callbacks+=bench.timing.StepTimer``), so both pay the same for being measured.
"""

from __future__ import annotations

import os
import time
import timeit
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from bench.record import WARMUP_ENV, StepClock, weights_checksum, write_record
from project.callbacks.dispatch import TRAIN_STEP_HOOKS


class StepTimer(L.Callback):
    """Stamp the end of every optimizer step; rank 0 writes the record when training ends.

    Args:
        warmup: Steps excluded from the throughput; ``None`` reads ``$BENCH_WARMUP`` (default 0).
    """

    def __init__(self, warmup: int | None = None) -> None:
        self.warmup = int(os.environ.get(WARMUP_ENV, 0)) if warmup is None else warmup
        self.clock: StepClock | None = None
        self.loss: torch.Tensor | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start a clock for this fit (synchronising CUDA at the window's edges on a GPU)."""
        on_gpu = trainer.strategy.root_device.type == "cuda"
        self.clock = StepClock(self.warmup, trainer.max_steps, torch.cuda.synchronize if on_gpu else None)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Stamp the step that just ended and keep its loss."""
        assert self.clock is not None
        self.clock.tick()
        self.loss = outputs["loss"] if isinstance(outputs, dict) else outputs

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rank 0 writes steps/s, first-step time, final loss and weights checksum.

        Every rank computes the checksum: sharded parameters (DTensors under fsdp and tensor parallelism) sum
        with collectives, which rank 0 alone would wait in forever, and a pipeline stage holds only its part.
        """
        checksum = whole_checksum(pl_module)
        if trainer.is_global_zero and self.clock is not None and self.loss is not None:
            record = self.clock.record(float(self.loss), checksum, world_size=trainer.world_size)
            write_record(record)


def whole_checksum(module: torch.nn.Module) -> float:
    """:func:`~bench.record.weights_checksum` of the whole model, whatever the layout; every rank must call it.

    Each parameter's sum is taken by name on every rank and the names are merged: a pipeline stage holds only its
    own parameters (under the whole model's names), while DDP replicas and gathered shards hold the same sums under
    the same names, which count once.
    """
    whole = ((name, p.full_tensor() if hasattr(p, "full_tensor") else p) for name, p in module.named_parameters())
    sums = {name: float(p.detach().double().sum()) for name, p in whole}
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        parts: list[dict[str, float] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, sums)
        sums = {name: value for part in parts if part for name, value in part.items()}
    return float(sum(sums.values()))


class HookTimer(StepTimer):
    """:class:`StepTimer` that also times, per step, each callback's per-step hooks and Lightning's call around them.

    ``--ablate`` runs the template once more with this in place of ``StepTimer`` (its steps/s are not reported:
    the timing itself costs about a microsecond per hook). The record gets ``hooks_us``: for each callback,
    the module's ``on_train_batch_end`` and its ``self.log`` calls (wherever they are made), the microseconds
    per measured step spent inside them, each exclusive of the others; and ``dispatch_us``: what Lightning
    spends calling each callback's hooks even when they do nothing (``getattr``, the callback's
    ``state_key``, the profiler's context), timed in the same process at the end of training for each
    per-step hook (a hook the template skips costs only its lookup).
    """

    def __init__(self, warmup: int | None = None) -> None:
        super().__init__(warmup)
        self.spent: dict[str, float] = {}
        self._nested: list[float] = []  # time spent in timed calls inside the one being timed

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Wrap the per-step hooks that each callback (and the module) overrides."""
        for callback in trainer.callbacks:
            if isinstance(callback, StepTimer):
                continue
            for hook in TRAIN_STEP_HOOKS:
                if getattr(type(callback), hook) is not getattr(L.Callback, hook):
                    self._wrap(callback, hook, type(callback).__name__)
        module = type(pl_module).__name__
        if type(pl_module).on_train_batch_end is not L.LightningModule.on_train_batch_end:
            self._wrap(pl_module, "on_train_batch_end", f"{module}.on_train_batch_end")
        self._wrap(pl_module, "log", f"{module}: self.log")

    def _wrap(self, owner: Any, hook: str, name: str) -> None:
        original = getattr(owner, hook)
        self.spent.setdefault(name, 0.0)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.clock is None or len(self.clock.times) < self.clock.warmup:
                return original(*args, **kwargs)
            start = time.perf_counter()
            self._nested.append(0.0)
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.spent[name] += elapsed - self._nested.pop()
                if self._nested:
                    self._nested[-1] += elapsed

        setattr(owner, hook, timed)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rank 0 adds the hook and dispatch times to the record it writes."""
        if not trainer.is_global_zero or self.clock is None or self.loss is None:
            return
        steps = max(1, len(self.clock.times) - self.clock.warmup)
        dispatch = {
            type(c).__name__: sum(dispatch_us(trainer, c, hook) for hook in TRAIN_STEP_HOOKS)
            for c in trainer.callbacks
            if not isinstance(c, StepTimer)
        }
        record = self.clock.record(
            float(self.loss),
            weights_checksum(pl_module),
            world_size=trainer.world_size,
            hooks_us={name: seconds * 1e6 / steps for name, seconds in self.spent.items()},
            dispatch_us=dispatch,
        )
        write_record(record)


def dispatch_us(trainer: L.Trainer, callback: L.Callback, hook: str, calls: int = 5000) -> float:
    """Microseconds Lightning's ``_call_callback_hooks`` spends around one call of ``callback``'s ``hook``.

    Without calling it: what the lookup, the profiler's action name and its context cost. A hook the
    template set to ``None`` (``project.callbacks.dispatch``) costs only the lookup.
    """
    profiler = trainer.profiler

    def once() -> None:  # what the loop in lightning.pytorch.trainer.call._call_callback_hooks does per callback
        fn = getattr(callback, hook)  # a name in a variable, as Lightning looks it up
        if callable(fn):
            with profiler.profile(f"[Callback]{callback.state_key}.{hook}"):
                pass

    best = min(timeit.repeat(once, number=calls, repeat=5))
    return best / calls * 1e6
