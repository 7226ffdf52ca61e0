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

from project.dotted import import_object
from project.plan.batch import BatchRequest, batch_fields
from project.plan.config import Hardware, ParallelConfig, refuse_unknown_choices
from project.plan.environment import LaunchEnvironment, requested_launcher
from project.plan.launch_notes import describe_launch
from project.plan.layout import LaunchMismatchError, Layout, resolve_layout
from project.plan.settings import resolve_backend, setting_notes
from project.plan.strategies import STRATEGIES, StrategyRow, is_interactive, strategy_name

__all__ = ["Hardware", "LaunchMismatchError", "ParallelConfig", "Plan", "resolve_plan"]


@dataclass(frozen=True)
class Plan:
    """The resolved layout: everything the Trainer and the loaders need, and why.

    Built once per run (:func:`resolve_plan`); the training loader's batch size, known inside the ranks, completes
    its batch fields (:meth:`with_data_batch`) and changes nothing else.
    """

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
    #: ``parallel.micro_batch``: the per-device batch (its other name), or what a layer says (the microbatch
    #: layer's ``auto``, until its search at the start of ``fit`` picked a size).
    micro_batch: int | str | None = None
    #: A layer splits each process's step into micro-batches itself (microbatch: ``auto``): the training loader hands
    #: each process its whole step, and Lightning accumulates nothing (:attr:`loader_batches`).
    splits_in_step: bool = False
    #: What layers add to plan.json (microbatch: ``micro_batch_trials``, the sizes its search tried).
    records: dict[str, Any] = field(default_factory=dict)
    #: What the batch fields were resolved from (not shown: the batch fields and notes say it).
    request: BatchRequest = field(default_factory=BatchRequest, repr=False)
    #: The notes that do not depend on the batch.
    setting_notes: tuple[str, ...] = field(default_factory=tuple, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the documented keys (``strategy`` carries its key arguments)."""
        layout = self.layout
        data = {
            "scenario": layout.scenario,
            "accelerator": layout.accelerator,
            "devices": layout.devices,
            "num_nodes": layout.num_nodes,
            "world_size": layout.world_size,
            **asdict(self),
            "degrees": layout.to_dict(),
        }
        del data["layout"]
        data["strategy"] = {"name": self.strategy, **data.pop("strategy_args")}
        data["notes"] = list(self.notes)
        data["capabilities"] = self.row.to_dict()
        del data["request"], data["setting_notes"], data["splits_in_step"]
        data.update(data.pop("records"))
        return data

    def with_data_batch(self, data_batch_size: int | None) -> Plan:
        """This plan with the training loader's batch size applied (its batch fields and their notes).

        Raises:
            UserError: the batch sizes do not divide or disagree (with the numbers and the fix).
        """
        fields, notes = batch_fields(self.layout, self.request, data_batch_size)
        return replace(self, **fields, notes=(*notes, *self.setting_notes))

    @property
    def loader_batches(self) -> tuple[int | None, int]:
        """``(samples per training-loader batch on a process, loader batches per optimizer step)``.

        What the sampler deals and Lightning's ``accumulate_grad_batches``; the data position of a checkpoint
        counts these batches. Where a layer splits each step itself (:attr:`splits_in_step`) a loader batch is a
        whole step of the process.
        """
        if self.splits_in_step and self.per_device_batch_size is not None:
            return self.per_device_batch_size * self.accumulation, 1
        return self.per_device_batch_size, self.accumulation

    @property
    def row(self) -> StrategyRow:
        """The strategy's row in the table: its builder and what it does (shards, checkpoint format)."""
        return STRATEGIES[self.strategy]

    @property
    def scenario(self) -> str:
        """The layout's scenario."""
        return self.layout.scenario

    @property
    def accelerator(self) -> str:
        """``cpu`` or ``gpu``."""
        return self.layout.accelerator

    @property
    def devices(self) -> list[int] | int:
        """The GPU ids of each node, or the CPU process count."""
        return self.layout.devices

    @property
    def num_nodes(self) -> int:
        """Machines in the job."""
        return self.layout.num_nodes

    @property
    def world_size(self) -> int:
        """All processes of the job."""
        return self.layout.world_size

    @property
    def dp_size(self) -> int:
        """Data-parallel degree: how many different slices of each global batch are trained at once."""
        return self.layout.dp_size

    def dp_rank(self, global_rank: int) -> int:
        """The data-parallel rank of ``global_rank``: a tensor-parallel group and a pipeline share their data."""
        return self.layout.dp_rank(global_rank)


def resolve_plan(
    config: ParallelConfig,
    hardware: Hardware,
    environment: LaunchEnvironment,
    data_batch_size: int | None,
) -> Plan:
    """Resolve and validate the ``parallel`` section for this hardware, launch environment and data batch size.

    ``data_batch_size`` is the training loader's batch size where known (``None``: the ranks complete it with
    :meth:`Plan.with_data_batch`).

    Raises:
        UserError: with the bad value, the rule and the fix, for every invalid combination.
    """
    refuse_unknown_choices(config)
    environment = requested_launcher(config.launcher, environment)
    layout = resolve_layout(config, hardware, environment)
    backend = resolve_backend(config, layout)
    request = BatchRequest.of(config)
    batch, batch_notes = batch_fields(layout, request, data_batch_size)
    external = environment.external
    start_method = "fork" if is_interactive() and not external else "popen"
    strategy = strategy_name(layout)
    launch, launch_notes = describe_launch(environment, layout.per_node, layout.num_nodes)
    settings = (*setting_notes(config, layout, strategy, start_method), *launch_notes)
    return Plan(
        layout=layout,
        strategy=strategy,
        strategy_args=import_object(STRATEGIES[strategy].args)(config, start_method),
        **batch,
        backend=backend,
        launcher=environment.launcher if (external or layout.world_size > 1) else "none",
        launch=launch,
        sync_batchnorm=config.sync_batchnorm,
        notes=(*batch_notes, *settings),
        cluster_environment=environment.cluster_environment if layout.world_size > 1 else None,
        precision=config.precision,
        request=request,
        setting_notes=settings,
    )
