"""The settings that do not depend on the batch, checked against the layout: the backend and the plan's notes."""

from __future__ import annotations

import signal

from project.errors import UserError
from project.layers import hooks
from project.plan.config import ParallelConfig
from project.plan.layout import Layout
from project.plan.precision import check_precision
from project.plan.scenarios import SCENARIOS


def resolve_backend(config: ParallelConfig, layout: Layout) -> str | None:
    """The process-group backend (``None`` on one process; auto: nccl on GPUs, gloo on CPU), other settings checked."""
    if config.timeout_s <= 0:
        raise UserError(f"parallel.timeout_s={config.timeout_s} must be > 0 seconds")
    check_stop_settings(config)
    if config.compile:  # the compile layer takes it off the section before the plan is resolved (its on_state hook)
        raise UserError(
            "parallel.compile=true needs the compile layer (project/extras/compile), which this checkout does not "
            "have; set parallel.compile false"
        )
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


def setting_notes(config: ParallelConfig, layout: Layout, strategy: str, start_method: str) -> list[str]:
    """The notes that do not depend on the batch: buffers, precision, each layer's, start method."""
    notes: list[str] = []
    if SCENARIOS[layout.scenario].data_parallel == "shard":  # no DDP wrapper: its flags would be ignored silently
        for name, default in {"find_unused_parameters": False, "broadcast_buffers": True}.items():
            if (value := getattr(config.ddp, name)) != default:
                raise UserError(
                    f"parallel.ddp.{name}={value} applies to DDP, and scenario {layout.scenario!r} shards the "
                    f"model instead; drop parallel.ddp.{name}, or use a scenario that replicates it (ddp, cpu)"
                )
    if layout.world_size > 1 and not config.ddp.broadcast_buffers:
        notes.append(
            "ddp.broadcast_buffers=false: each rank keeps its own buffers (BatchNorm statistics, any module's); "
            "checkpoints save and restore every rank's, validation runs on rank 0's"
        )
    if precision_note := check_precision(config.precision, layout.accelerator):
        notes.append(precision_note)
    for layer_notes in hooks("plan_notes"):  # a layer's subsection checked against the layout (sharding: fsdp)
        notes += layer_notes(config, layout, strategy, start_method)
    if layout.world_size > 1 and start_method == "fork":
        notes.append("interactive session: processes are started by fork")
    return notes


def check_stop_settings(config: ParallelConfig) -> None:
    """Refuse ``stop_signals`` a handler cannot catch, and a ``stop_grace_s`` that is not a positive time."""
    catchable = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGXCPU")
    for name in config.stop_signals:
        if name not in catchable or not hasattr(signal, name):
            raise UserError(
                f"parallel.stop_signals lists {name!r}, which a fit cannot stop on; list signals among "
                f"{', '.join(catchable)} (SIGKILL and SIGSTOP cannot be caught)"
            )
    if not config.stop_grace_s > 0:
        raise UserError(f"parallel.stop_grace_s={config.stop_grace_s} must be > 0 seconds")
