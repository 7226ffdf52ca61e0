"""The seed's DistributedDataParallel recipe, one section per step, in the seed's order.

Each section starts with the seed's lines it replaces (docs/parallel.md); the launch is :mod:`project.launch.legacy`'s.
Importing this module imports no Lightning: :func:`unwrap` serves the plain-Python export too.
"""

from __future__ import annotations

import inspect
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from project.errors import RunFailure, UserError
from project.layers import first_answer, observed
from project.lightning_private import COMPILED_ATTRIBUTE, WRAPPER_ATTRIBUTE, WRAPPER_CLASS_NAMES
from project.parallel.batch_samplers import install_batch_sampler, own_batching
from project.parallel.collectives import process_group_size
from project.parallel.sampler_install import (
    Guarantee,
    install_eval_sampler,
    install_training_sampler,
    refuse_several_training_loaders,
)
from project.parallel.strategies import row_of

if TYPE_CHECKING:
    from project.plan.layout import Layout
    from project.plan.resolve import Plan


# --- 1. The process group and DDP. The seed:
#   torch.cuda.set_device(local_rank)
#   torch.distributed.init_process_group(backend="nccl", init_method="env://")
#   model = DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank, broadcast_buffers=False)
# Lightning's DDPStrategy sets the device, joins the group and wraps the model; the plan gives it these options.
def ddp_buffer_kwargs(broadcast_buffers: bool) -> dict[str, bool]:
    """The seed's ``broadcast_buffers`` under the installed torch's name (2.13: ``forward_sync_buffers``)."""
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": broadcast_buffers}


def ddp_kwargs(args: dict[str, Any], backend: str | None) -> dict[str, Any]:
    """Lightning ``DDPStrategy`` keyword arguments from the plan's DDP arguments (``plan``'s ``ddp_args``)."""
    kwargs = dict(args)
    ddp = kwargs.pop("ddp")  # the parallel.ddp subsection: DDP's flags
    return {
        "process_group_backend": backend,  # parallel.backend; env:// and set_device are Lightning's
        "timeout": timedelta(seconds=kwargs.pop("timeout_s")),
        "start_method": kwargs.pop("start_method"),
        **kwargs,
        "find_unused_parameters": ddp["find_unused_parameters"],
        **ddp_buffer_kwargs(ddp["broadcast_buffers"]),
    }


def build_ddp(args: dict[str, Any], backend: str | None, layout: Layout) -> Any:
    """Lightning's ``DDPStrategy`` (data parallel over every process): the ``ddp`` rows' builder."""
    from lightning.pytorch.strategies import DDPStrategy

    return DDPStrategy(**ddp_kwargs(args, backend))


# --- 2. Each process its share of the data. The seed:
#   sampler = DistributedSampler(dataset)
# Here the global batch is the same at any world size, and evaluation counts each sample once (no padding).
def training_sampler(
    loader: Any, plan: Plan, global_rank: int, run_seed: int, limit: int | float
) -> tuple[Any, Guarantee]:
    """The training loader cut into the plan's global batches, the same at any world size, or unchanged and why."""
    per_device, accumulation = plan.loader_batches
    world, rank = plan.dp_size, plan.dp_rank(global_rank)  # not the world: tensor-parallel groups share data
    refuse_several_training_loaders(loader, world)
    if own_batching(loader) is not None:  # the user's batches are the global batches: each split over the ranks
        return install_batch_sampler(loader, plan, global_rank, run_seed)
    if per_device is None:
        return loader, Guarantee(False, "the training loader has no batch_size")
    try:
        return install_training_sampler(loader, per_device, world, rank, run_seed, accumulation, limit)
    except ValueError as error:
        raise UserError(f"data: {error}") from None


def evaluation_sampler(
    loader: Any, plan: Plan, global_rank: int, stage: str, limit: int | float | None
) -> tuple[Any, Guarantee]:
    """An evaluation loader whose ranks take contiguous, unpadded shards (each sample once), or unchanged and why."""
    return install_eval_sampler(loader, plan.dp_size, plan.dp_rank(global_rank), stage, limit)


# --- 3. The barrier. The seed:
#   def synchronize():
#       if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1: return
#       dist.barrier()
class BarrierTimeoutError(RunFailure):
    """Raised when some ranks did not reach a barrier in time."""


def synchronize(name: str, timeout_s: float) -> float:
    """Wait for every rank at barrier ``name`` (BarrierCallback's); return this rank's wait in seconds (0: one rank)."""
    if process_group_size() == 1:
        return 0.0
    start, timeout = time.perf_counter(), timedelta(seconds=timeout_s)
    try:
        if dist.get_backend() == "gloo":  # a monitored barrier names the ranks that did not arrive
            # The Flight Recorder does not see this wait: a layer may (the hang report records it).
            with observed("observe_wait", "monitored_barrier", name, timeout_s):
                dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
        elif not dist.barrier(async_op=True).wait(timeout=timeout):
            raise RuntimeError(f"not every rank arrived within {timeout_s:g} s")
    except RuntimeError as error:
        detail = str(error).splitlines()[0] if str(error) else "timed out"
        failed = f"barrier '{name}' failed on rank {dist.get_rank()} after {time.perf_counter() - start:.1f} s"
        # A layer's line naming who is where (the hang report: every rank's record); else the backend's own words.
        stalled = first_answer("explain_stall", f"{failed} (timeout {timeout_s:g} s)")
        raise BarrierTimeoutError(
            f"{failed} (timeout {timeout_s:g} s): {stalled or detail}" + (f" ({detail})" if stalled else "")
        ) from error
    return time.perf_counter() - start


# --- 4. Evaluation on the bare model. The seed, at test time:
#   model = model.module
#: Attributes through which wrappers hold the module they wrap: DP/DDP (``module``), torch.compile's, Lightning's.
WRAPPER_ATTRS = ("module", COMPILED_ATTRIBUTE, WRAPPER_ATTRIBUTE)


def _is_wrapper(model: nn.Module) -> bool:
    # Matched by name too, so that this module never imports Lightning or torch._dynamo.
    names = ("OptimizedModule", *WRAPPER_CLASS_NAMES)
    return isinstance(model, (nn.DataParallel, DistributedDataParallel)) or type(model).__name__ in names


def unwrap(model: nn.Module) -> nn.Module:
    """``model.module``, for any depth of nesting: the bare module under DP, DDP, compile and Lightning wrappers."""
    seen = 0
    while _is_wrapper(model):
        inner = next((getattr(model, attr) for attr in WRAPPER_ATTRS if hasattr(model, attr)), None)
        if not isinstance(inner, nn.Module) or seen > 32:
            break
        model, seen = inner, seen + 1
    return model


class Unwrapped(NamedTuple):
    """What :func:`evaluate_unwrapped` changed, for :func:`rewrap` to undo: the wrapper, each rank's own buffers."""

    wrapper: nn.Module | None
    own_buffers: list[torch.Tensor]


def evaluate_unwrapped(trainer: Any, pl_module: nn.Module) -> Unwrapped:
    """Evaluate the bare module with rank 0's buffers (BatchNorm statistics): the DDP wrapper taken off."""
    model = trainer.strategy.model
    # A sharded (FSDP) module keeps its wrapper (its forward gathers its parameters) but gets rank 0's buffers too.
    swap = model is not None and unwrap(model) is not model
    own: list[torch.Tensor] = []
    if (swap or row_of(trainer.strategy).shards_parameters) and trainer.world_size > 1:
        # Each rank's own, put back after: with broadcast_buffers false they are its statistics to train on.
        own = [buffer.detach().clone() for buffer in pl_module.buffers()]
        for buffer in pl_module.buffers():
            buffer.copy_(trainer.strategy.broadcast(buffer, src=0))
    if swap:
        trainer.strategy.model = pl_module
    return Unwrapped(model if swap else None, own)


def rewrap(trainer: Any, pl_module: nn.Module, unwrapped: Unwrapped | None) -> None:
    """Undo :func:`evaluate_unwrapped` for training: the DDP wrapper back, each rank's own buffers back."""
    if unwrapped is None:
        return
    for buffer, own in zip(pl_module.buffers(), unwrapped.own_buffers, strict=False):
        buffer.copy_(own)
    if unwrapped.wrapper is not None:
        trainer.strategy.model = unwrapped.wrapper
