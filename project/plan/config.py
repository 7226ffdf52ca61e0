"""The ``parallel`` config section: what the user asked for, before it meets a machine."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

from project.errors import UserError
from project.layers import rows
from project.plan.scenarios import SCENARIO_NAMES

# The choices come from the scenario table, so a new scenario is a row there (jsonargparse reads the Literal).
Scenario = Literal[SCENARIO_NAMES]  # type: ignore[valid-type]
Backend = Literal["auto", "nccl", "gloo"]
Launcher = Literal["auto", "ray"]
Precision = Literal["32", "64", "bf16-mixed", "16-mixed"]


@dataclass
class DdpOptions:
    """The ``parallel.ddp`` subsection: DistributedDataParallel's own flags (scenarios cpu, dp, ddp, fork, zero1).

    Args:
        find_unused_parameters: DDP's flag for models whose forward skips parameters.
        broadcast_buffers: Copy rank 0's buffers (BatchNorm statistics) to every rank each forward (the seed: False).
    """

    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    moved_from_flat = True  # not a field: the options were flat once (MOVED_FIELDS)


@dataclass
class CoreParallelConfig:
    """The ``parallel`` config section.

    One strategy's options sit in its subsection (``ddp``, each layer's: :func:`with_subsections`); what every strategy
    reads stays flat. A flat name that moved is refused with its new one (:data:`MOVED_FIELDS`).

    Args:
        scenario: auto (every GPU, one GPU, or the CPU), or a row of the scenario table (docs/parallel.md shows each).
        devices: "all", a count N, or a list of GPU ids (``[0, 1, 2]`` or ``"0,1,2"``); on CPU the number of
            processes. ``None``: the scenario's default (all GPUs, 1 CPU process, or what torchrun started).
        num_nodes: Machines in the job; ``None`` means 1, or what the launcher says.
        global_batch_size: Samples per optimizer step over all processes; ``None``: from the loader's ``batch_size``.
        per_device_batch_size: Samples per micro-batch on one device (what fits in its memory).
        accumulation: Micro-batches per optimizer step; any two of global, per-device and accumulation decide the third.
        micro_batch: ``per_device_batch_size``'s other name, or ``auto``: the largest that fits (docs/parallel.md).
        backend: auto (nccl on GPUs, gloo on CPU) | nccl | gloo.
        sync_batchnorm: Convert BatchNorm to SyncBatchNorm (GPUs only).
        timeout_s: Seconds a collective of the process group may wait before failing.
        launcher: auto (Lightning's launcher, or the outside one that started the processes: torchrun, SLURM,
            Kubeflow) | ray (the same run as a Ray Train job: the ray layer, ``pip install -e .[ray]``).
        compile: Apply ``torch.compile`` to the model after the DDP/FSDP wrap (the compile layer; refused without).
        precision: 32 | 64 (float64 everywhere) | bf16-mixed | 16-mixed (GPUs only): the Trainer's precision.
        ddp: DDP's flags (``find_unused_parameters``, ``broadcast_buffers``).
        cpu_threads: Intra-op threads of each CPU process; ``None``: the cores shared evenly (or ``OMP_NUM_THREADS``).
        stop_signals: Signals that stop a fit at the same step on every rank, save it and exit 75 (docs/reliability.md).
        stop_grace_s: Seconds from the first signal within which the process ends, saved or not (SLURM's KillWait: 30).
    """

    scenario: Scenario = "auto"
    devices: int | list[int] | str | None = None
    num_nodes: int | None = None
    global_batch_size: int | None = None
    per_device_batch_size: int | None = None
    accumulation: int | None = None
    micro_batch: int | Literal["auto"] | None = None
    backend: Backend = "auto"
    sync_batchnorm: bool = False
    timeout_s: float = 1800.0
    launcher: Launcher = "auto"
    compile: bool = False
    precision: Precision = "32"
    cpu_threads: int | None = None
    stop_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"])
    stop_grace_s: float = 20.0
    ddp: DdpOptions = field(default_factory=DdpOptions)

    def __post_init__(self) -> None:
        # The parser hands a subsection over as a mapping (``Namespace.as_dict``).
        for name, kind in SUBSECTIONS.items():
            if isinstance(getattr(self, name), dict):
                setattr(self, name, kind(**getattr(self, name)))


#: The subsections of ``parallel``, by field name: the core's ``ddp``, then each installed layer's.
SUBSECTIONS: dict[str, Any] = {"ddp": DdpOptions, **rows("parallel")}
#: Flat names of earlier versions -> their place now (``sharding`` -> ``fsdp.sharding``), for the parser's error, from
#: each subsection whose class says ``moved_from_flat = True``.
MOVED_FIELDS: dict[str, str] = {
    option.name: f"{name}.{option.name}"
    for name, kind in SUBSECTIONS.items()
    if getattr(kind, "moved_from_flat", False)
    for option in fields(kind)
}


def with_subsections(base: type, subsections: dict[str, Any]) -> type:
    """``ParallelConfig``: the core's fields, then each layer's subsection (its help: its docstring's first line)."""
    added = {name: kind for name, kind in subsections.items() if not any(f.name == name for f in fields(base))}
    doc = str(base.__doc__).rstrip()
    for name, kind in added.items():
        doc += f"\n        {name}: {str(kind.__doc__).strip().splitlines()[0]}"
    return make_dataclass(
        "ParallelConfig",
        [(name, kind, field(default_factory=kind)) for name, kind in added.items()],
        bases=(base,),
        namespace={"__doc__": doc + "\n    ", "__module__": __name__},
    )


#: The ``parallel`` section of this checkout (:class:`CoreParallelConfig` and each installed layer's subsections).
ParallelConfig: Any = with_subsections(CoreParallelConfig, SUBSECTIONS)


@dataclass(frozen=True)
class Hardware:
    """The machine the plan is for: its GPU count, and whether that count was assumed (``--assume_gpus``)."""

    gpus: int
    assumed: bool = False


def refuse_unknown_choices(config: Any, prefix: str = "parallel") -> None:
    """Refuse a ``Literal`` field of the section or its subsections outside its choices (code skips the parser)."""
    for name, hint in get_type_hints(type(config)).items():
        value = getattr(config, name)
        if is_dataclass(value):
            refuse_unknown_choices(value, f"{prefix}.{name}")
        elif get_origin(hint) is Literal and value not in (choices := get_args(hint)):
            raise UserError(f"{prefix}.{name}={value!r} is not one of {', '.join(map(str, choices))}")
