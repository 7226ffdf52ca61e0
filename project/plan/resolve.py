"""The ``parallel`` section (what the user asked) resolved into a frozen, printable :class:`Plan`.

Resolution is a pure function of (config, hardware, launch environment, data batch size): it starts
no process and touches no GPU, so every scenario x hardware case is a unit test. The data batch size is
the batch size of the training loader the datamodule returns; it is known once that loader exists, and
the plan is resolved again with it (``None`` before). Side effects (building the Trainer and its
strategy) come after, inside the ranks: :func:`project.parallel.strategies.trainer_kwargs`.

Scenarios, in the seed's words:

- ``dp``: ``nn.DataParallel(model)`` / ``device_ids=[0, 1, 2]``. Lightning has no DP any more, so it
  runs as DDP over the same GPUs and keeps DP's batch meaning: the global batch is split evenly.
- ``ddp``: ``DistributedDataParallel`` with one process per GPU; the data batch size is per device.
- ``cpu``: N processes over gloo without GPUs, the way distributed code is tested here.
- ``single``: one GPU. ``auto``: every GPU (ddp), one GPU (single) or the CPU.
- Several machines: any scenario but ``dp`` with ``num_nodes > 1``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from project.errors import UserError
from project.plan.batch import lr_factor, resolve_batch
from project.plan.config import BACKENDS, Hardware, ParallelConfig
from project.plan.environment import LaunchEnvironment, describe_launch, requested_launcher
from project.plan.layout import LaunchMismatchError, Layout, resolve_layout
from project.plan.precision import check_precision
from project.plan.strategies import STRATEGIES, StrategyRow, is_interactive, strategy_name

__all__ = ["Hardware", "LaunchMismatchError", "ParallelConfig", "Plan", "resolve_plan"]


@dataclass(frozen=True)
class BatchRequest:
    """What the ``parallel`` section asked of the batch and learning rate: completed by the loader's batch size."""

    global_batch_size: int | None = None
    per_device_batch_size: int | None = None
    accumulation: int | None = None
    lr_scaling: str = "none"
    reference_batch_size: int | None = None
    warmup_steps: int = 0
    configured_lr: float | None = None


@dataclass(frozen=True)
class Plan:
    """The resolved layout: everything the Trainer and the loaders need, and why.

    Built once per run (:func:`resolve_plan`); the training loader's batch size, known inside the ranks, completes
    its batch fields (:meth:`with_data_batch`) and changes nothing else.
    """

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
    #: What the batch fields were resolved from (not shown: the batch fields and notes say it).
    request: BatchRequest = field(default_factory=BatchRequest, repr=False)
    #: The notes that do not depend on the batch.
    setting_notes: tuple[str, ...] = field(default_factory=tuple, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the documented keys (``strategy`` carries its key arguments)."""
        data = asdict(self)
        data["strategy"] = {"name": self.strategy, **data.pop("strategy_args")}
        data["notes"] = list(self.notes)
        data["capabilities"] = self.row.to_dict()
        del data["request"], data["setting_notes"]
        return data

    def with_data_batch(self, data_batch_size: int | None) -> Plan:
        """This plan with the training loader's batch size applied (its batch, learning rate and their notes).

        Raises:
            UserError: the batch sizes do not divide or disagree (with the numbers and the fix).
        """
        fields, notes = _batch(self.scenario, self.degrees, self.request, data_batch_size)
        return replace(self, **fields, notes=(*notes, *self.setting_notes))

    @property
    def row(self) -> StrategyRow:
        """The strategy's row in the table: its builder and what it does (shards, checkpoint format)."""
        return STRATEGIES[self.strategy]

    @property
    def dp_size(self) -> int:
        """Data-parallel degree: how many different slices of each global batch are trained at once."""
        return self.degrees.get("dp_replicate", self.world_size) * self.degrees.get("dp_shard", 1)

    def dp_rank(self, global_rank: int) -> int:
        """The data-parallel rank of ``global_rank``: the ranks of one tensor-parallel group share their data."""
        return global_rank // self.degrees.get("tp", 1)


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


def _batch(
    scenario: str, degrees: dict[str, int], request: BatchRequest, data_batch_size: int | None
) -> tuple[dict[str, Any], list[str]]:
    """The plan's batch and learning-rate fields for ``data_batch_size``, and the notes that explain them."""
    dp_size = degrees["dp_replicate"] * degrees["dp_shard"]
    size_name = "world size" if degrees.get("tp", 1) == 1 else "data-parallel size"
    batch = resolve_batch(
        scenario,
        request.global_batch_size,
        data_batch_size,
        dp_size,
        request.per_device_batch_size,
        request.accumulation,
        size_name,
    )
    notes: list[str] = []
    if scenario == "dp" and batch.global_ is not None:
        notes.append(
            "dp runs as DDP (Lightning removed DataParallel): one process per GPU instead of threads; "
            f"the global batch {batch.global_} is split into {batch.per_device} per GPU, as DataParallel's scatter did"
        )
    factor = lr_factor(request.lr_scaling, batch.global_, request.reference_batch_size)
    if request.lr_scaling != "none" and factor is not None:
        notes.append(
            f"learning rates x {factor:g} ({request.lr_scaling}: global batch {batch.global_} against the "
            f"reference {request.reference_batch_size})"
        )
    if batch.accumulation > 1:
        notes.append(
            f"gradient accumulation: {batch.accumulation} micro-batches of {batch.per_device} per process make one "
            f"optimizer step of {batch.global_}; DDP all-reduces on the last micro-batch only"
        )
    configured = request.configured_lr
    fields = {
        "per_device_batch_size": batch.per_device,
        "global_batch_size": batch.global_,
        "accumulation": batch.accumulation,
        "learning_rate": {
            "scaling": request.lr_scaling,
            "reference_batch_size": request.reference_batch_size,
            "factor": factor,
            "warmup_steps": request.warmup_steps,
            "lr": None
            if configured is None or factor is None
            else {"configured": configured, "scaled": configured * factor},
        },
    }
    return fields, notes


def _setting_notes(config: ParallelConfig, layout: Layout, strategy: str, start_method: str) -> list[str]:
    """The notes that do not depend on the batch: buffers, precision, compile, sharding, start method."""
    notes: list[str] = []
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
    return notes


def resolve_plan(
    config: ParallelConfig,
    hardware: Hardware,
    environment: LaunchEnvironment,
    data_batch_size: int | None,
    configured_lr: float | None = None,
) -> Plan:
    """Resolve and validate the ``parallel`` section for this hardware, launch environment and data batch size.

    ``data_batch_size`` is the training loader's batch size where known (``None``: the ranks complete it with
    :meth:`Plan.with_data_batch`); ``configured_lr`` is the optimizer's learning rate in the config, shown beside
    its scaled value.

    Raises:
        UserError: with the bad value, the rule and the fix, for every invalid combination.
    """
    environment = requested_launcher(config.launcher, environment)
    layout = resolve_layout(config, hardware, environment)
    if config.timeout_s <= 0:
        raise UserError(f"parallel.timeout_s={config.timeout_s} must be > 0 seconds")
    if config.warmup_steps < 0:
        raise UserError(f"parallel.warmup_steps={config.warmup_steps} must be >= 0")
    backend = _backend(config, layout)
    request = BatchRequest(
        config.global_batch_size,
        config.per_device_batch_size,
        config.accumulation,
        config.lr_scaling,
        config.reference_batch_size,
        config.warmup_steps,
        configured_lr,
    )
    batch, batch_notes = _batch(layout.scenario, layout.degrees, request, data_batch_size)
    external = environment.external
    start_method = "fork" if is_interactive() and not external else "popen"
    strategy = strategy_name(layout.scenario, layout.world_size)
    launch, launch_notes = describe_launch(environment, layout.per_node, layout.num_nodes)
    setting_notes = (*_setting_notes(config, layout, strategy, start_method), *launch_notes)
    return Plan(
        scenario=layout.scenario,
        accelerator=layout.accelerator,
        devices=layout.devices,
        strategy=strategy,
        strategy_args=STRATEGIES[strategy].args(config, start_method),
        num_nodes=layout.num_nodes,
        world_size=layout.world_size,
        **batch,
        backend=backend,
        launcher=environment.launcher if (external or layout.world_size > 1) else "none",
        launch=launch,
        sync_batchnorm=config.sync_batchnorm,
        degrees=layout.degrees,
        notes=(*batch_notes, *setting_notes),
        cluster_environment=environment.cluster_environment if layout.world_size > 1 else None,
        precision=config.precision,
        compile=config.compile,
        request=request,
        setting_notes=setting_notes,
    )
