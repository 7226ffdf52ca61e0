"""Trial steps for ``micro_batch: auto``: does a micro-batch of ``m`` samples fit, on every rank?

A trial is one training step of this process on ``m`` real samples: the module's ``training_step``, its backward
and every optimizer's step (which allocates the optimizer state, the way the first real step will). Whatever it
changed is put back exactly afterwards: parameters, buffers, gradients, optimizer state and learning rates, the
random generators, the train/eval mode of every submodule and the states of its torchmetrics.

No collective runs inside a trial: the module's own ``training_step`` is called (not DDP's forward, which may
broadcast buffers), and its backward runs under DDP's ``no_sync``. So a rank that runs out of memory anywhere in
it cannot leave another rank waiting in a collective; the ranks meet afterwards in one MIN all-reduce of their
verdicts (:func:`agree`), and every rank keeps the same size. Out of memory is what it really is:
``torch.OutOfMemoryError`` on a GPU, ``RuntimeError: ... DefaultCPUAllocator: can't allocate memory`` on the CPU.
"""

from __future__ import annotations

import contextlib
import gc
import random
from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from torchmetrics import Metric

#: A trial's verdict on one rank (MIN over the ranks: an error anywhere wins, then out of memory anywhere).
FITS, OUT_OF_MEMORY, FAILED = 2, 1, 0


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed (GPU or CPU), not a bug in the step."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


class _Saved:
    """Everything a trial step may change, copied before it (on the CPU: the copy must not cost device memory)."""

    def __init__(self, module: L.LightningModule, optimizers: list[torch.optim.Optimizer]) -> None:
        self.tensors = {name: t.detach().to("cpu", copy=True) for name, t in _tensors(module)}
        self.grads = {name: p.grad for name, p in module.named_parameters()}  # None at the start of fit
        self.modes = {name: sub.training for name, sub in module.named_modules()}
        self.optimizers = [(_copy(dict(opt.state)), [_copy(_group(g)) for g in opt.param_groups]) for opt in optimizers]
        self.metrics = {name: _copy(m.metric_state) for name, m in module.named_modules() if isinstance(m, Metric)}
        self.random = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        self.cuda_random = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def restore(self, module: L.LightningModule, optimizers: list[torch.optim.Optimizer]) -> None:
        """Put every saved value back in place (the same tensors, so optimizers and wrappers keep pointing at them)."""
        with torch.no_grad():
            for name, tensor in _tensors(module):
                tensor.copy_(self.tensors[name])
        for name, param in module.named_parameters():
            param.grad = self.grads[name]
        for name, sub in module.named_modules():
            sub.training = self.modes[name]
        for opt, (state, groups) in zip(optimizers, self.optimizers):
            opt.state.clear()
            opt.state.update(state)
            for group, saved in zip(opt.param_groups, groups):
                group.update(saved)
        for name, metric in module.named_modules():
            if isinstance(metric, Metric):
                metric.reset()
                for key, value in self.metrics[name].items():
                    setattr(metric, key, value)
        torch.set_rng_state(self.random[0])
        random.setstate(self.random[1])
        np.random.set_state(self.random[2])
        if self.cuda_random is not None:
            torch.cuda.set_rng_state_all(self.cuda_random)


def _tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module.named_parameters()
    yield from (("buffer:" + name, buffer) for name, buffer in module.named_buffers())


def _group(group: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in group.items() if key != "params"}


def _copy(value: Any) -> Any:
    """A copy of nested dicts/lists of tensors and plain values (tensors cloned, the rest shared)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(item) for item in value)
    return value


@contextlib.contextmanager
def _quiet(module: L.LightningModule) -> Iterator[None]:
    """``self.log`` does nothing during a trial: it is not a step of the run (and no loop collects it)."""
    module.log = lambda *args, **kwargs: None  # type: ignore[method-assign]
    module.log_dict = lambda *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.log, module.log_dict


def _loss_of(output: Any) -> torch.Tensor:
    loss = output.get("loss") if isinstance(output, dict) else output
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"training_step returned {type(output).__name__}, not a loss to try the micro-batch with")
    return loss


def try_micro_batch(trainer: L.Trainer, batch: Any) -> tuple[int, BaseException | None]:
    """One trial step of this process on ``batch`` (on the device already): its verdict, and its error.

    The error is that of a step that failed for another reason than memory (raised once the ranks agreed).

    The state of the module, the optimizers and the random generators is the same afterwards as before.
    """
    module, strategy = trainer.lightning_module, trainer.strategy
    optimizers = list(trainer.optimizers)
    saved = _Saved(module, optimizers)
    # DDP: no gradient all-reduce in this backward (the module's own training_step skips DDP's forward too).
    no_sync = getattr(strategy.model, "no_sync", None)
    verdict, caught = FITS, None
    try:
        with no_sync() if callable(no_sync) else contextlib.nullcontext(), _quiet(module):
            module.train()
            with strategy.precision_plugin.train_step_context():
                loss = _loss_of(module.training_step(batch, 0))
            loss.backward()
            del loss
            for optimizer in optimizers:
                optimizer.step()
    except Exception as error:  # every failure becomes a verdict all ranks agree on
        if is_out_of_memory(error):
            verdict = OUT_OF_MEMORY  # its traceback is not kept: its frames hold the tensors that did not fit
        else:
            verdict, caught = FAILED, error
    finally:
        saved.restore(module, optimizers)
        del saved
        gc.collect()  # the failed trial's tensors, held by the traceback's frames
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return verdict, caught


def agree(verdict: int, device: torch.device) -> int:
    """The worst verdict over all ranks (one MIN all-reduce; this rank's own without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return verdict
    flag = torch.tensor([verdict], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return int(flag.item())
