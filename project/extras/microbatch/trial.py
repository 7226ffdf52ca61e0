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
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from torchmetrics import Metric

#: A trial's verdict on one rank (MIN over the ranks: an error anywhere wins, then out of memory anywhere).
FITS, OUT_OF_MEMORY, FAILED = 2, 1, 0


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed (GPU or CPU), not a bug in the step."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


class StepState:
    """What a forward and backward change besides gradients, copied before them so that they can be undone.

    Buffers (a BatchNorm's running statistics; cloned where they are, they are small), the states of the module's
    torchmetrics, the random generators (torch, CUDA, numpy, ``random``) and each submodule's train/eval mode.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.buffers = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}
        self.modes = {name: sub.training for name, sub in module.named_modules()}
        self.metrics = {name: _copy(m.metric_state) for name, m in module.named_modules() if isinstance(m, Metric)}
        self.random = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        self.cuda_random = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def restore(self, module: torch.nn.Module) -> None:
        """Put every saved value back in place (into the same tensors, which wrappers keep pointing at)."""
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                buffer.copy_(self.buffers[name])
        for name, sub in module.named_modules():
            sub.training = self.modes[name]
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


class _Saved:
    """Everything a trial step may change: :class:`StepState`, and the parameters, gradients and optimizers.

    The parameters are copied to the CPU: the copy must not cost device memory.
    """

    def __init__(self, module: L.LightningModule, optimizers: list[torch.optim.Optimizer]) -> None:
        self.step = StepState(module)
        self.params = {name: p.detach().to("cpu", copy=True) for name, p in module.named_parameters()}
        self.grads = {name: p.grad for name, p in module.named_parameters()}  # None at the start of fit
        self.optimizers = [(_copy(dict(opt.state)), [_copy(_group(g)) for g in opt.param_groups]) for opt in optimizers]

    def restore(self, module: L.LightningModule, optimizers: list[torch.optim.Optimizer]) -> None:
        """Put every saved value back in place (the same tensors, so optimizers and wrappers keep pointing at them)."""
        with torch.no_grad():
            for name, param in module.named_parameters():
                param.copy_(self.params[name])
        for name, param in module.named_parameters():
            param.grad = self.grads[name]
        for opt, (state, groups) in zip(optimizers, self.optimizers):
            opt.state.clear()
            opt.state.update(state)
            for group, saved in zip(opt.param_groups, groups):
                group.update(saved)
        self.step.restore(module)


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
def recording_logs(module: L.LightningModule, logged: list[tuple[str, tuple, dict]]) -> Iterator[None]:
    """``self.log`` / ``self.log_dict`` calls kept in ``logged`` (name, args, kwargs) instead of being made.

    A trial step is not a step of the run, and an attempt of a step counts only once every rank fitted it
    (:mod:`.split_step`); the values are kept detached.
    """

    def keeper(name: str) -> Any:
        def keep(*args: Any, **kwargs: Any) -> None:
            logged.append((name, tuple(_detached(a) for a in args), {k: _detached(v) for k, v in kwargs.items()}))

        return keep

    module.log, module.log_dict = keeper("log"), keeper("log_dict")  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.log, module.log_dict


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, dict):
        return {key: _detached(item) for key, item in value.items()}
    return value


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
        with no_sync() if callable(no_sync) else contextlib.nullcontext(), recording_logs(module, []):
            module.train()
            with strategy.precision_plugin.train_step_context():
                loss = _loss_of(call_training_step(module.training_step, batch, 0))
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


def call_training_step(training_step: Callable[..., Any], batch: Any, batch_idx: int) -> Any:
    """``training_step(batch[, batch_idx])``: ``batch_idx`` only where the method takes it, as Lightning passes it."""
    if is_param_in_hook_signature(training_step, "batch_idx", min_args=2):
        return training_step(batch, batch_idx)
    return training_step(batch)


def agree(verdict: int, device: torch.device) -> int:
    """The worst verdict over all ranks (one MIN all-reduce; this rank's own without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return verdict
    flag = torch.tensor([verdict], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return int(flag.item())
