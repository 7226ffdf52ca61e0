"""The ``parallel`` section (what the user asked) resolved into a frozen, printable :class:`Plan`.

Resolution is a pure function of (config, hardware, launch environment, data batch size): it starts
no process and touches no GPU, so every scenario x hardware case is a unit test. The data batch size is
the batch size of the training loader the datamodule returns; it is known once that loader exists, and
the plan is resolved again with it (``None`` before). Side effects (building the Trainer and its
strategy) come after, from :meth:`Plan.trainer_kwargs`.

Scenarios, in the seed's words:

- ``dp``: ``nn.DataParallel(model)`` / ``device_ids=[0, 1, 2]``. Lightning has no DP any more, so it
  runs as DDP over the same GPUs and keeps DP's batch meaning: the global batch is split evenly.
- ``ddp``: ``DistributedDataParallel`` with one process per GPU; the data batch size is per device.
- ``cpu``: N processes over gloo without GPUs, the way distributed code is tested here.
- ``single``: one GPU. ``auto``: every GPU (ddp), one GPU (single) or the CPU.
- Several machines: any scenario but ``dp`` with ``num_nodes > 1``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from project.errors import UserError
from project.parallel.batch import lr_factor, resolve_batch
from project.parallel.config import BACKENDS, Hardware, ParallelConfig
from project.parallel.environment import LaunchEnvironment, cluster_environment, describe_launch, requested_launcher
from project.parallel.layout import LaunchMismatchError, Layout, resolve_layout
from project.parallel.precision import check_precision
from project.parallel.strategies import STRATEGIES, ddp_buffer_kwargs, is_interactive, strategy_name

__all__ = ["Hardware", "LaunchMismatchError", "ParallelConfig", "Plan", "ddp_buffer_kwargs", "resolve_plan"]


@dataclass(frozen=True)
class Plan:
    """The resolved layout: everything the Trainer and the loaders need, and why."""

    scenario: str
    accelerator: str
    devices: list[int] | int
    strategy: str
    strategy_args: dict[str, Any]
    num_nodes: int
    world_size: int
    per_device_batch_size: int | None
    global_batch_size: int | None
    accumulation: int
    learning_rate: dict[str, Any]
    backend: str | None
    launcher: str
    launch: dict[str, Any]
    sync_batchnorm: bool
    degrees: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Ray and Kubeflow: the Lightning ClusterEnvironment (import path) that reads the launcher's ranks.
    cluster_environment: str | None = None
    #: The Trainer's precision (``32``, ``bf16-mixed``, ``16-mixed``): the plan owns ``trainer.precision``.
    precision: str = "32"
    #: ``torch.compile`` the module's networks in place after the strategy's wrap (``project.parallel.compile``).
    compile: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the documented keys (``strategy`` carries its key arguments)."""
        data = asdict(self)
        data["strategy"] = {"name": self.strategy, **data.pop("strategy_args")}
        data["notes"] = list(self.notes)
        return data

    def trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``lightning.Trainer`` (they replace accelerator/devices/strategy/...)."""
        return {
            "accelerator": self.accelerator,
            "devices": self.devices,
            "num_nodes": self.num_nodes,
            "strategy": self._strategy(),
            "sync_batchnorm": self.sync_batchnorm,
            "accumulate_grad_batches": self.accumulation,
            "precision": self.precision,
        }

    def _strategy(self) -> Any:
        """The table's strategy; for a launcher Lightning does not detect, with the environment that reads its ranks."""
        strategy = STRATEGIES[self.strategy].build(self.strategy_args, self.backend)
        if self.cluster_environment is not None and not isinstance(strategy, str):
            strategy.cluster_environment = cluster_environment(self.cluster_environment)
        return strategy


def _backend(config: ParallelConfig, layout: Layout) -> str | None:
    if config.backend not in BACKENDS:
        raise UserError(
            f"parallel.backend={config.backend!r} is not available here; use one of {', '.join(BACKENDS)} "
            "(auto picks nccl on GPUs, gloo on CPU)"
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


def _sharding_notes(config: ParallelConfig, layout: Layout, strategy: str, start_method: str) -> list[str]:
    """The ``fsdp`` fields checked against the layout, and what the plan says about them.

    Raises:
        UserError: an fsdp field with another scenario, hybrid on one node, fsdp in a notebook.
    """
    fields = {"sharding": "full", "cpu_offload": False, "wrap_modules": None}
    if layout.scenario != "fsdp":
        for name, default in fields.items():
            if getattr(config, name) != default:
                raise UserError(
                    f"parallel.{name}={getattr(config, name)!r} applies to scenario fsdp only, and this plan's "
                    f"scenario is {layout.scenario!r}; drop it, or set parallel.scenario: fsdp"
                )
        return []
    if config.sharding == "hybrid" and layout.num_nodes < 2:
        raise UserError(
            f"parallel.sharding='hybrid' shards within a node and replicates across nodes, but num_nodes="
            f"{layout.num_nodes}; use sharding full (or grad_op) on one node, or set parallel.num_nodes > 1"
        )
    if strategy == "single_device":
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
    }[config.sharding]
    across = (
        f"within each node ({layout.dp_shard} processes), replicated across {layout.dp_replicate} nodes"
        if config.sharding == "hybrid"
        else f"over all {layout.dp_shard} processes"
    )
    notes = [f"fsdp {config.sharding}: {what} sharded {across}; checkpoints are sharded folders"]
    if layout.accelerator == "cpu":
        notes.append("fsdp on CPU processes over gloo (no GPU visible): the same FSDP2 code as on GPUs")
        if config.cpu_offload:
            notes.append("cpu_offload on CPU processes changes nothing: the parameters are in host memory already")
    return notes


def resolve_plan(
    config: ParallelConfig,
    hardware: Hardware,
    environment: LaunchEnvironment,
    data_batch_size: int | None,
    configured_lr: float | None = None,
) -> Plan:
    """Resolve and validate the ``parallel`` section for this hardware, launch environment and data batch size.

    ``configured_lr`` is the optimizer's learning rate in the config, shown beside its scaled value.

    Raises:
        UserError: with the bad value, the rule and the fix, for every invalid combination.
    """
    environment = requested_launcher(config.launcher, environment)
    layout = resolve_layout(config, hardware, environment)
    if config.timeout_s <= 0:
        raise UserError(f"parallel.timeout_s={config.timeout_s} must be > 0 seconds")
    backend = _backend(config, layout)
    batch = resolve_batch(
        layout.scenario,
        config.global_batch_size,
        data_batch_size,
        layout.world_size,
        config.per_device_batch_size,
        config.accumulation,
    )
    external = environment.external
    start_method = "fork" if is_interactive() and not external else "popen"
    strategy = strategy_name(layout.scenario, layout.world_size)
    notes: list[str] = []
    if layout.scenario == "dp" and batch.global_ is not None:
        notes.append(
            "dp runs as DDP (Lightning removed DataParallel): one process per GPU instead of threads; "
            f"the global batch {batch.global_} is split into {batch.per_device} per GPU, as DataParallel's scatter did"
        )
    if config.warmup_steps < 0:
        raise UserError(f"parallel.warmup_steps={config.warmup_steps} must be >= 0")
    factor = lr_factor(config.lr_scaling, batch.global_, config.reference_batch_size)
    if config.lr_scaling != "none" and factor is not None:
        notes.append(
            f"learning rates x {factor:g} ({config.lr_scaling}: global batch {batch.global_} against the "
            f"reference {config.reference_batch_size})"
        )
    if batch.accumulation > 1:
        notes.append(
            f"gradient accumulation: {batch.accumulation} micro-batches of {batch.per_device} per process make one "
            f"optimizer step of {batch.global_}; DDP all-reduces on the last micro-batch only"
        )
    if layout.world_size > 1 and not config.broadcast_buffers:
        notes.append("broadcast_buffers=false: each rank keeps its own BatchNorm running statistics between syncs")
    precision_note = check_precision(config.precision, layout.accelerator)
    if precision_note:
        notes.append(precision_note)
    if config.compile:
        notes.append(
            "compile: torch.compile (inductor) is applied in place to the module's networks after the strategy "
            "wraps the model; the first training and evaluation steps include compilation"
        )
    notes += _sharding_notes(config, layout, strategy, start_method)
    if strategy != "single_device" and start_method == "fork":
        notes.append("interactive session: processes are started by fork")
    launch, launch_notes = describe_launch(environment, layout.per_node, layout.num_nodes)
    return Plan(
        scenario=layout.scenario,
        accelerator=layout.accelerator,
        devices=layout.devices,
        strategy=strategy,
        strategy_args=STRATEGIES[strategy].args(config, start_method),
        num_nodes=layout.num_nodes,
        world_size=layout.world_size,
        per_device_batch_size=batch.per_device,
        global_batch_size=batch.global_,
        accumulation=batch.accumulation,
        learning_rate={
            "scaling": config.lr_scaling,
            "reference_batch_size": config.reference_batch_size,
            "factor": factor,
            "warmup_steps": config.warmup_steps,
            "lr": None
            if configured_lr is None or factor is None
            else {"configured": configured_lr, "scaled": configured_lr * factor},
        },
        backend=backend,
        launcher=environment.launcher if (external or layout.world_size > 1) else "none",
        launch=launch,
        sync_batchnorm=config.sync_batchnorm,
        degrees={"dp_replicate": layout.dp_replicate, "dp_shard": layout.dp_shard},
        notes=(*notes, *launch_notes),
        cluster_environment=environment.cluster_environment if layout.world_size > 1 else None,
        precision=config.precision,
        compile=config.compile,
    )
