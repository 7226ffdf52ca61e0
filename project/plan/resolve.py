"""The ``parallel`` section resolved into a :class:`Plan`: pure (no process, no GPU), so each case is a unit test."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from project.dotted import import_object
from project.plan.batch import BatchRequest, batch_fields
from project.plan.config import Hardware, ParallelConfig, refuse_unknown_choices
from project.plan.environment import LaunchEnvironment, requested_launcher
from project.plan.launch_notes import describe_launch
from project.plan.layout import LaunchMismatchError, Layout, resolve_layout
from project.plan.settings import resolve_backend, setting_notes
from project.plan.strategies import STRATEGIES, StrategyRow, is_interactive, strategy_name

__all__ = ["Hardware", "LaunchMismatchError", "ParallelConfig", "Plan", "resolve_plan"]


def _from_layout(name: str, doc: str) -> Any:
    """A read-only attribute of the plan that is its layout's ``name``."""
    return property(lambda plan: getattr(plan.layout, name), doc=doc)


@dataclass(frozen=True)
class Plan:
    """Everything the Trainer and the loaders need, and why (the notes); built once per run (:func:`resolve_plan`)."""

    #: Where the processes go and the parallel degrees by name: the one source of every size below.
    layout: Layout
    strategy: str
    strategy_args: dict[str, Any]
    per_device_batch_size: int | None
    global_batch_size: int | None
    accumulation: int
    backend: str | None
    launcher: str
    launch: dict[str, Any]
    sync_batchnorm: bool
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Ray and Kubeflow: the Lightning ClusterEnvironment (import path) that reads the launcher's ranks.
    cluster_environment: str | None = None
    #: The Trainer's precision (``32``, ``bf16-mixed``, ``16-mixed``): the plan owns ``trainer.precision``.
    precision: str = "32"
    #: The per-device batch, or a layer's ``auto`` (microbatch) until its search at the start of ``fit`` picks a size.
    micro_batch: int | str | None = None
    #: A layer (microbatch ``auto``) splits each step itself: a loader batch is a whole step (:attr:`loader_batches`).
    splits_in_step: bool = False
    #: What layers add to plan.json (microbatch: ``micro_batch_trials``).
    records: dict[str, Any] = field(default_factory=dict)
    request: BatchRequest = field(default_factory=BatchRequest, repr=False)
    #: The notes that do not depend on the batch.
    setting_notes: tuple[str, ...] = field(default_factory=tuple, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the documented keys (``strategy`` carries its key arguments)."""
        data = {key: getattr(self, key) for key in ("scenario", "accelerator", "devices", "num_nodes", "world_size")}
        data |= {**asdict(self), "degrees": self.layout.to_dict()}
        del data["layout"], data["request"], data["setting_notes"], data["splits_in_step"]
        data["strategy"] = {"name": self.strategy, **data.pop("strategy_args")}
        data["notes"] = list(self.notes)
        data["capabilities"] = self.row.to_dict()
        data.update(data.pop("records"))
        return data

    def with_data_batch(self, data_batch_size: int | None) -> Plan:
        """This plan with the training loader's batch size applied: its batch fields and their notes, nothing else."""
        fields, notes = batch_fields(self.layout, self.request, data_batch_size)
        return replace(self, **fields, notes=(*notes, *self.setting_notes))

    @property
    def loader_batches(self) -> tuple[int | None, int]:
        """``(samples per training-loader batch on a process, loader batches per optimizer step)``.

        What the sampler deals and Lightning's ``accumulate_grad_batches``; a checkpoint's data position counts these.
        """
        if self.splits_in_step and self.per_device_batch_size is not None:
            return self.per_device_batch_size * self.accumulation, 1
        return self.per_device_batch_size, self.accumulation

    @property
    def row(self) -> StrategyRow:
        """The strategy's row in the table: its builder and what it does (shards, checkpoint format)."""
        return STRATEGIES[self.strategy]

    # The layout's values, read through the plan.
    scenario = _from_layout("scenario", "The layout's scenario.")
    accelerator = _from_layout("accelerator", "``cpu`` or ``gpu``.")
    devices = _from_layout("devices", "The GPU ids of each node, or the CPU process count.")
    num_nodes = _from_layout("num_nodes", "Machines in the job.")
    world_size = _from_layout("world_size", "All processes of the job.")
    dp_size = _from_layout(
        "dp_size", "Data-parallel degree: how many different slices of each global batch train at once."
    )

    def dp_rank(self, global_rank: int) -> int:
        """The data-parallel rank of ``global_rank``: a tensor-parallel group and a pipeline share their data."""
        return self.layout.dp_rank(global_rank)


def resolve_plan(
    config: ParallelConfig, hardware: Hardware, environment: LaunchEnvironment, data_batch_size: int | None
) -> Plan:
    """Resolve the ``parallel`` section (``data_batch_size`` ``None``: the ranks complete it); errors say the fix."""
    refuse_unknown_choices(config)
    environment = requested_launcher(config.launcher, environment)
    layout = resolve_layout(config, hardware, environment)
    backend = resolve_backend(config, layout)
    request = BatchRequest.of(config)
    batch, batch_notes = batch_fields(layout, request, data_batch_size)
    start_method = "fork" if is_interactive() and not environment.external else "popen"
    strategy = strategy_name(layout)
    launch, launch_notes = describe_launch(environment, layout.per_node, layout.num_nodes)
    settings = (*setting_notes(config, layout, strategy, start_method), *launch_notes)
    return Plan(
        layout=layout,
        strategy=strategy,
        strategy_args=import_object(STRATEGIES[strategy].args)(config, start_method),
        **batch,
        backend=backend,
        launcher=environment.launcher if (environment.external or layout.world_size > 1) else "none",
        launch=launch,
        sync_batchnorm=config.sync_batchnorm,
        notes=(*batch_notes, *settings),
        cluster_environment=environment.cluster_environment if layout.world_size > 1 else None,
        precision=config.precision,
        request=request,
        setting_notes=settings,
    )
