"""``micro_batch: auto`` while training: each process's step in micro-batches, split finer when memory runs out.

Under ``auto`` the training loader hands each process its whole share of a global batch (``P`` samples) as one
batch, and Lightning accumulates nothing. :class:`SplitStep` stands in for the module's ``training_step``:

- it splits the batch into ``P / m`` micro-batches (:func:`split_batch`) and runs the module's own
  ``training_step`` and a backward on each; their gradients add up in ``.grad``, as under Lightning's
  accumulation. These forwards do not go through DDP's wrapper, so their backwards all-reduce nothing;
- the ranks agree on the outcome in one MIN all-reduce (:func:`~.trial.agree`);
- if every rank fitted, it returns the step's loss through :class:`_SyncGradients`, whose backward adds zero to
  each gradient: Lightning's backward of it makes DDP all-reduce the gradients added up, once;
- if a rank ran out of memory (a data-dependent spike), every rank undoes the attempt (gradients, buffers,
  torchmetrics states, random generators, the values it logged) and does the step again in the next smaller
  micro-batch: the same samples, so the same result. The smaller size is kept for the rest of the run.

So an out-of-memory error on one rank never leaves another waiting in a collective, at the start or mid-run. A
``training_step`` that runs collectives of its own (an all-gather) is outside that promise.

The gradients are zeroed here, at the start of each attempt: Lightning's ``optimizer_zero_grad``, which comes
after ``training_step``, is made a no-op while this stands in.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from project.errors import RunFailure, UserError
from project.extras.microbatch.trial import (
    FAILED,
    FITS,
    OUT_OF_MEMORY,
    StepState,
    agree,
    call_training_step,
    is_out_of_memory,
    recording_logs,
)


def split_batch(batch: Any, size: int, parts: int) -> list[Any]:
    """``batch`` (``size`` samples, as the loader collated them) cut into ``parts`` micro-batches of equal size.

    Tensors whose first dimension is ``size`` are cut along it; lists and tuples of ``size`` plain values
    (strings, numbers) are sliced; dicts, lists, tuples and named tuples are walked; anything else is handed
    whole to every micro-batch.

    Raises:
        UserError: nothing in the batch has ``size`` samples along its first dimension.
    """
    step = size // parts
    found = False

    def cut(value: Any) -> list[Any]:
        nonlocal found
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size:
            found = True
            return list(torch.split(value, step))
        if isinstance(value, dict):
            pieces = {key: cut(item) for key, item in value.items()}
            return [type(value)({key: piece[i] for key, piece in pieces.items()}) for i in range(parts)]
        if isinstance(value, (list, tuple)):
            if len(value) == size and value and all(isinstance(v, (str, bytes, int, float)) for v in value):
                found = True
                return [value[i * step : (i + 1) * step] for i in range(parts)]
            columns = [cut(item) for item in value]
            rows = [[column[i] for column in columns] for i in range(parts)]
            if hasattr(value, "_fields"):  # a named tuple
                return [type(value)(*row) for row in rows]
            return [type(value)(row) for row in rows]
        return [value] * parts

    pieces = cut(batch)
    if not found:
        raise UserError(
            f"parallel.micro_batch='auto' splits each training batch of {size} samples along its first dimension; "
            f"this {type(batch).__name__} batch has nothing of that length: set parallel.micro_batch to a number"
        )
    return pieces


class _SyncGradients(torch.autograd.Function):
    """The step's loss, unchanged; its backward adds zero to each parameter's gradient.

    Backward passes through every parameter that has a gradient, so DDP's hooks fire and all-reduce the
    gradients the micro-batches added up, exactly as after the last micro-batch of an accumulation.
    """

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.specs = [(p.shape, p.dtype, p.device) for p in params]
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # A zero expanded to the parameter's shape: added in place, it allocates nothing.
        zeros = (torch.zeros((), dtype=dtype, device=device).expand(shape) for shape, dtype, device in ctx.specs)
        return (None, *zeros)


def _loss_of(output: Any) -> torch.Tensor | None:
    loss = output.get("loss") if isinstance(output, dict) else output
    if loss is not None and not isinstance(loss, torch.Tensor):
        raise TypeError(f"training_step returned {type(output).__name__}, not a loss to split the step with")
    return loss


class SplitStep:
    """The module's ``training_step`` under ``micro_batch: auto``: micro-batches of ``micro`` samples, agreed.

    Args:
        trainer: The fitting Trainer (its strategy's root device carries the agreement).
        micro: The micro-batch the start-of-fit search picked.
        sizes: The micro-batches ``auto`` may use, largest first; ``micro`` is one of them.
        per_process: Samples per process and optimizer step (``P``): the training loader's batch.
    """

    def __init__(self, trainer: L.Trainer, micro: int, sizes: list[int], per_process: int) -> None:
        self.trainer, self.micro, self.per_process = trainer, micro, per_process
        self.smaller = [size for size in sizes if size < micro]
        #: ``(optimizer step, from, to)`` for each time the run split finer.
        self.drops: list[tuple[int, int, int]] = []
        module = trainer.lightning_module
        self._module = module
        self._training_step: Callable[..., Any] = module.training_step
        self._zero_grad: Callable[..., Any] = module.optimizer_zero_grad

    def install(self) -> None:
        """Stand in for the module's ``training_step`` and ``optimizer_zero_grad`` (on the instance)."""
        self._module.training_step = self.step  # type: ignore[method-assign]
        self._module.optimizer_zero_grad = lambda *args, **kwargs: None  # type: ignore[method-assign]

    def uninstall(self) -> None:
        """Hand the module its own methods back."""
        for name in ("training_step", "optimizer_zero_grad"):
            self._module.__dict__.pop(name, None)

    def step(self, batch: Any, batch_idx: int = 0) -> Any:
        """One optimizer step's forward and backward, in micro-batches; again, finer, if a rank ran out of memory."""
        while True:
            self._zero_grads(batch_idx)
            before, logged = StepState(self._module), []
            verdict, output, error = self._attempt(batch, batch_idx, logged)
            agreed = agree(verdict, self.trainer.strategy.root_device)
            if agreed == FITS:
                for name, log_args, log_kwargs in logged:  # the step counts: it fitted on every rank
                    getattr(type(self._module), name)(self._module, *log_args, **log_kwargs)
                return output
            self._zero_grads(batch_idx)
            before.restore(self._module)
            del output, before
            gc.collect()  # the failed attempt's tensors, held by its frames
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if agreed == FAILED:
                if error is not None:
                    raise error
                raise RunFailure("micro_batch auto: a training step failed on another rank; its error is above")
            self._split_finer()

    def _attempt(
        self, batch: Any, batch_idx: int, logged: list[tuple[str, tuple, dict]]
    ) -> tuple[int, Any, BaseException | None]:
        """This rank's try at the step: its verdict, its output (when it fitted) and its error (another failure).

        What the step logs is kept in ``logged``, to be logged once every rank fitted.
        """
        parts = self.per_process // self.micro
        try:
            with recording_logs(self._module, logged):
                losses, last = [], None
                for chunk in split_batch(batch, self.per_process, parts):
                    last = call_training_step(self._training_step, chunk, batch_idx)
                    loss = _loss_of(last)
                    if loss is not None:
                        (loss / parts).backward()
                        losses.append(loss.detach())
                    del loss
        except Exception as error:  # every failure becomes a verdict all ranks agree on
            if is_out_of_memory(error):
                return OUT_OF_MEMORY, None, None  # no traceback kept: its frames hold what did not fit
            return FAILED, None, error
        return FITS, self._output(last, losses, batch_idx), None

    def _output(self, last: Any, losses: list[torch.Tensor], batch_idx: int) -> Any:
        """What Lightning gets back: the last micro-batch's output, its loss the mean of the step's."""
        if not losses:  # every micro-batch skipped: so does the optimizer step (no gradients)
            self._zero_grads(batch_idx)
            return None
        params = [p for p in self._module.parameters() if p.grad is not None]
        loss = _SyncGradients.apply(torch.stack(losses).mean(), *params)
        return {**last, "loss": loss} if isinstance(last, dict) else loss

    def _zero_grads(self, batch_idx: int) -> None:
        """The module's own ``optimizer_zero_grad`` (a user's override too) for each optimizer."""
        for optimizer in self.trainer.optimizers:
            self._zero_grad(self.trainer.current_epoch, batch_idx, optimizer)

    def _split_finer(self) -> None:
        """The next smaller micro-batch, said in one line by rank 0; refused when there is none."""
        step = self.trainer.global_step
        if not self.smaller:
            raise RunFailure(
                f"micro_batch auto: optimizer step {step} ran out of memory on a rank even in micro-batches of "
                f"{self.micro} sample(s); use more processes, a smaller model, or scenario fsdp with a fixed "
                "parallel.micro_batch"
            )
        before, self.micro = self.micro, self.smaller.pop(0)
        self.drops.append((step, before, self.micro))
        if self.trainer.is_global_zero:
            sys.stderr.write(
                f"warning: micro_batch auto: optimizer step {step} ran out of memory on a rank in micro-batches of "
                f"{before}; every rank does it again in micro-batches of {self.micro} (accumulation "
                f"{self.per_process // self.micro}), which changes no result\n"
            )
