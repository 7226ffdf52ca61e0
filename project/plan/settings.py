"""The settings that do not depend on the batch, checked against the layout: the backend and the plan's notes."""

from __future__ import annotations

import signal

from project.errors import UserError
from project.plan.config import ParallelConfig
from project.plan.layout import Layout
from project.plan.precision import check_precision
from project.plan.scenarios import SCENARIOS


def resolve_backend(config: ParallelConfig, layout: Layout) -> str | None:
    """The process-group backend (``None`` on one process): auto is nccl on GPUs, gloo on CPU.

    Raises:
        UserError: an unknown backend, nccl on CPU, or SyncBatchNorm on CPU; a timeout or warmup below its minimum.
    """
    if config.timeout_s <= 0:
        raise UserError(f"parallel.timeout_s={config.timeout_s} must be > 0 seconds")
    if config.warmup_steps < 0:
        raise UserError(f"parallel.warmup_steps={config.warmup_steps} must be >= 0")
    check_stop_settings(config)
    if config.sync_batchnorm and layout.accelerator == "cpu":
        raise UserError(
            "parallel.sync_batchnorm=true needs GPUs (SyncBatchNorm does not run on CPU); "
            "set it false, or use a GPU scenario"
        )
    if layout.world_size == 1:
        return None
    backend = config.backend if config.backend != "auto" else ("gloo" if layout.accelerator == "cpu" else "nccl")
    if backend == "nccl" and layout.accelerator == "cpu":
        raise UserError("parallel.backend='nccl' needs GPUs; use 'gloo' (or 'auto') for CPU processes")
    return backend


def _sharding_notes(config: ParallelConfig, layout: Layout, strategy: str, start_method: str) -> list[str]:
    """The ``parallel.fsdp`` fields checked against the layout, and what the plan says about them.

    Raises:
        UserError: an fsdp field with another scenario, hybrid on one node, fsdp in a notebook.
    """
    fsdp = config.fsdp
    fields = {"sharding": "full", "cpu_offload": False, "wrap_modules": None}
    if SCENARIOS[layout.scenario].data_parallel != "shard":
        for name, default in fields.items():
            if getattr(fsdp, name) != default:
                raise UserError(
                    f"parallel.fsdp.{name}={getattr(fsdp, name)!r} applies to scenario fsdp only, and this plan's "
                    f"scenario is {layout.scenario!r}; drop it, or set parallel.scenario: fsdp"
                )
        return []
    if fsdp.sharding == "hybrid" and layout.num_nodes < 2:
        raise UserError(
            f"parallel.fsdp.sharding='hybrid' shards within a node and replicates across nodes, but num_nodes="
            f"{layout.num_nodes}; use sharding full (or grad_op) on one node, or set parallel.num_nodes > 1"
        )
    if layout.world_size == 1:
        return [
            "fsdp on one process: nothing to shard, it runs on a single device and writes plain checkpoint files "
            "(sharding, cpu_offload and wrap_modules apply from 2 processes); it resumes sharded checkpoints"
        ]
    if start_method == "fork":
        raise UserError(
            "scenario fsdp starts its processes by running the command again, which an interactive session "
            "cannot; run it from a terminal, or use scenario fork (DDP) here"
        )
    what = {
        "full": "parameters, gradients and optimizer state",
        "grad_op": "gradients and optimizer state (parameters stay gathered from forward to backward)",
        "hybrid": "parameters, gradients and optimizer state",
    }[fsdp.sharding]
    across = (
        f"within each node ({layout.dp_shard} processes), replicated across {layout.dp_replicate} nodes"
        if fsdp.sharding == "hybrid"
        else f"over all {layout.dp_shard} processes"
    )
    notes = [f"fsdp {fsdp.sharding}: {what} sharded {across}; checkpoints are sharded folders"]
    if layout.accelerator == "cpu":
        notes.append("fsdp on CPU processes over gloo (no GPU visible): the same FSDP2 code as on GPUs")
        if fsdp.cpu_offload:
            notes.append("cpu_offload on CPU processes changes nothing: the parameters are in host memory already")
    return notes


def setting_notes(config: ParallelConfig, layout: Layout, strategy: str, start_method: str) -> list[str]:
    """The notes that do not depend on the batch: buffers, precision, compile, sharding, start method."""
    notes: list[str] = []
    if layout.world_size > 1 and not config.ddp.broadcast_buffers:
        notes.append("ddp.broadcast_buffers=false: each rank keeps its own BatchNorm running statistics between syncs")
    precision_note = check_precision(config.precision, layout.accelerator)
    if precision_note:
        notes.append(precision_note)
    if config.compile:
        notes.append(
            "compile: torch.compile (inductor) is applied in place to the module's networks after the strategy "
            "wraps the model; the first training and evaluation steps include compilation"
        )
    notes += _sharding_notes(config, layout, strategy, start_method)
    if layout.world_size > 1 and start_method == "fork":
        notes.append("interactive session: processes are started by fork")
    return notes


def check_stop_settings(config: ParallelConfig) -> None:
    """``stop_signals`` name signals a handler can catch, and ``stop_grace_s`` is a positive time.

    Raises:
        UserError: naming the bad value and the signals that may be listed.
    """
    catchable = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGXCPU")
    for name in config.stop_signals:
        if name not in catchable or not hasattr(signal, name):
            raise UserError(
                f"parallel.stop_signals lists {name!r}, which a fit cannot stop on; list signals among "
                f"{', '.join(catchable)} (SIGKILL and SIGSTOP cannot be caught)"
            )
    if not config.stop_grace_s > 0:
        raise UserError(f"parallel.stop_grace_s={config.stop_grace_s} must be > 0 seconds")
