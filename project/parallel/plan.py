"""The ``parallel`` section (what the user asked) resolved into a frozen, printable :class:`Plan`.

Resolution is a pure function of (config, hardware, launch environment, data batch size): it starts
no process and touches no GPU, so every scenario x hardware case is a unit test. Side effects
(building the Trainer and its strategy) come after, from :meth:`Plan.trainer_kwargs`.

Scenarios, in the seed's words:

- ``dp``: ``nn.DataParallel(model)`` / ``device_ids=[0, 1, 2]``. Lightning has no DP any more, so it
  runs as DDP over the same GPUs and keeps DP's batch meaning: the global batch is split evenly.
- ``ddp``: ``DistributedDataParallel`` with one process per GPU; the data batch size is per device.
- ``cpu``: N processes over gloo without GPUs, the way distributed code is tested here.
- ``single``: one GPU. ``auto``: every GPU (ddp), one GPU (single) or the CPU.
- Several machines: any scenario but ``dp`` with ``num_nodes > 1``.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from project.errors import UserError
from project.parallel.environment import LaunchEnvironment, describe_launch

SCENARIOS = ("auto", "cpu", "single", "dp", "ddp")
BACKENDS = ("auto", "nccl", "gloo")
GPU_SCENARIOS = ("single", "dp", "ddp")
# Where an outside launcher's numbers come from, for messages that say what to change.
_LAUNCHER_SOURCES = {
    "slurm": {"devices": "--ntasks-per-node (SLURM_NTASKS_PER_NODE)", "num_nodes": "--nodes (SLURM_NNODES)"},
}
_ELASTIC_SOURCES = {
    "devices": "--nproc_per_node (LOCAL_WORLD_SIZE)",
    "num_nodes": "--nnodes (WORLD_SIZE / LOCAL_WORLD_SIZE)",
}


class LaunchMismatchError(UserError):
    """The config asks for another layout than the outside launcher (torchrun, SLURM) started."""


@dataclass
class ParallelConfig:
    """The ``parallel`` config section.

    Args:
        scenario: auto | cpu | single | dp | ddp.
        devices: "all", a count N, or a list of GPU ids (``[0, 1, 2]`` or ``"0,1,2"``); on CPU the
            number of processes. ``None`` means the scenario's default (all GPUs, 1 CPU process, or
            what an outside launcher such as torchrun started).
        num_nodes: Machines in the job; ``None`` means 1, or what the launcher says.
        global_batch_size: Samples per optimizer step over all processes; ``None`` keeps the data
            batch size (per device for ddp/cpu, global for dp).
        backend: auto (nccl on GPUs, gloo on CPU) | nccl | gloo.
        broadcast_buffers: The seed's DDP flag: copy rank 0's buffers (BatchNorm statistics) to
            every rank at each forward. The seed sets it False.
        sync_batchnorm: Convert BatchNorm to SyncBatchNorm (GPUs only).
        find_unused_parameters: DDP's flag for models whose forward skips parameters.
        timeout_s: Seconds a collective (and the barrier callback) may wait before failing.
    """

    scenario: str = "auto"
    devices: int | list[int] | str | None = None
    num_nodes: int | None = None
    global_batch_size: int | None = None
    backend: str = "auto"
    broadcast_buffers: bool = True
    sync_batchnorm: bool = False
    find_unused_parameters: bool = False
    timeout_s: float = 1800.0


@dataclass(frozen=True)
class Hardware:
    """The machine the plan is for: its GPU count, and whether that count was assumed (``--assume_gpus``)."""

    gpus: int
    assumed: bool = False


@dataclass(frozen=True)
class Plan:
    """The resolved layout: everything the Trainer and the datamodule need, and why."""

    scenario: str
    accelerator: str
    devices: list[int] | int
    strategy: str
    strategy_args: dict[str, Any]
    num_nodes: int
    world_size: int
    per_device_batch_size: int | None
    global_batch_size: int | None
    backend: str | None
    launcher: str
    launch: dict[str, Any]
    sync_batchnorm: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the documented keys (``strategy`` carries its key arguments)."""
        data = asdict(self)
        data["strategy"] = {"name": self.strategy, **data.pop("strategy_args")}
        data["notes"] = list(self.notes)
        return data

    def trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``lightning.Trainer`` (they replace accelerator/devices/strategy/...)."""
        strategy: Any = "auto"
        if self.strategy == "ddp":
            from lightning.pytorch.strategies import DDPStrategy

            args = dict(self.strategy_args)
            args.update(ddp_buffer_kwargs(args.pop("broadcast_buffers")))
            strategy = DDPStrategy(
                process_group_backend=self.backend,
                timeout=timedelta(seconds=args.pop("timeout_s")),
                start_method=args.pop("start_method"),
                **args,
            )
        return {
            "accelerator": self.accelerator,
            "devices": self.devices,
            "num_nodes": self.num_nodes,
            "strategy": strategy,
            "sync_batchnorm": self.sync_batchnorm,
        }


def ddp_buffer_kwargs(broadcast_buffers: bool) -> dict[str, bool]:
    """The seed's ``broadcast_buffers`` under the name the installed torch uses.

    torch 2.13 deprecates ``broadcast_buffers`` (FutureWarning) for ``forward_sync_buffers``, which
    keeps the per-forward meaning; buffers are still synced once at start-up, when every rank holds
    the same freshly initialised values anyway.
    """
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
    return {name: broadcast_buffers}


def is_interactive() -> bool:
    """A notebook or REPL, where processes must be forked (Lightning's own rule)."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or "ipykernel" in sys.modules


def _nearest_multiples(value: int, step: int) -> list[int]:
    below = (value // step) * step
    return [m for m in (below, below + step) if m > 0]


def _gpu_ids(devices: Any, gpus: int, scenario: str) -> list[int] | None:
    """GPU ids from "all" / N / [ids] / "0,1,2", checked against the machine; None means "all"."""
    if devices is None or devices == "all" or devices == -1 or devices == "-1":
        return None
    if isinstance(devices, str):
        text = devices.strip().strip("[]")
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            raise UserError(
                f"parallel.devices={devices!r} is not 'all', a count or a list of GPU ids; write e.g. [0, 1, 2]"
            )
        # A lone number is a count (N GPUs), as Lightning reads it; a comma list is ids.
        devices = int(parts[0]) if len(parts) == 1 and "," not in text else [int(p) for p in parts]
    if isinstance(devices, bool):
        raise UserError(f"parallel.devices={devices!r} is not 'all', a count or a list of GPU ids")
    if isinstance(devices, int):
        if devices < 1:
            raise UserError(f"parallel.devices={devices} must be >= 1 (or 'all'); use 1 for one GPU")
        if devices > gpus:
            raise UserError(
                f"parallel.devices={devices} asks for more GPUs than this machine has ({gpus}); "
                f"use at most {gpus} or 'all'"
            )
        return list(range(devices))
    ids = list(devices)
    if not ids:
        raise UserError("parallel.devices=[] is empty; list at least one GPU id, or use 'all'")
    bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or i < 0 or i >= gpus]
    if bad:
        valid = f"0..{gpus - 1}" if gpus else "none: no GPU is visible"
        raise UserError(f"parallel.devices={ids}: GPU id(s) {bad} do not exist (valid ids: {valid})")
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise UserError(f"parallel.devices={ids} repeats GPU id(s) {duplicates}; list each GPU once")
    return ids


def _cpu_processes(devices: Any) -> int | None:
    if devices is None:
        return None
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices.strip())
    if isinstance(devices, bool) or not isinstance(devices, int):
        raise UserError(
            f"parallel.devices={devices!r} with scenario 'cpu' must be a number of processes (e.g. 2); "
            "GPU ids and 'all' need a GPU scenario"
        )
    if devices < 1:
        raise UserError(f"parallel.devices={devices} must be >= 1 processes")
    return devices


def _resolve_scenario(config: ParallelConfig, hardware: Hardware) -> str:
    if config.scenario not in SCENARIOS:
        raise UserError(f"parallel.scenario={config.scenario!r} is not one of {', '.join(SCENARIOS)}")
    if config.scenario != "auto":
        if config.scenario in GPU_SCENARIOS and hardware.gpus == 0:
            asked = f" with devices={config.devices!r}" if config.devices is not None else ""
            raise UserError(
                f"parallel.scenario={config.scenario!r}{asked} needs GPUs but no GPU is visible; "
                "use scenario 'cpu' (devices N runs N processes), or plan with --assume_gpus N"
            )
        return config.scenario
    if hardware.gpus == 0:
        return "cpu"
    return "ddp" if hardware.gpus > 1 and config.devices not in (1, "1") else "single"


def _check_against_launcher(name: str, asked: int | None, given: int | None, launcher: str) -> int | None:
    """An outside launcher fixes the layout: take its number, or refuse a config that disagrees."""
    if given is None:
        return asked
    if asked is not None and asked != given:
        source = _LAUNCHER_SOURCES.get(launcher, _ELASTIC_SOURCES)[name]
        raise LaunchMismatchError(
            f"parallel.{name}={asked} disagrees with {launcher}, which started {given} ({source}); "
            f"set parallel.{name} to {given} or drop it to take the launcher's value"
        )
    return given


def resolve_plan(
    config: ParallelConfig,
    hardware: Hardware,
    environment: LaunchEnvironment,
    data_batch_size: int | None,
) -> Plan:
    """Resolve and validate the ``parallel`` section for this hardware and launch environment.

    Raises:
        UserError: with the bad value, the rule and the fix, for every invalid combination.
    """
    scenario = _resolve_scenario(config, hardware)
    notes: list[str] = []
    if config.num_nodes is not None and config.num_nodes < 1:
        raise UserError(f"parallel.num_nodes={config.num_nodes} must be >= 1")
    if config.backend not in BACKENDS:
        raise UserError(
            f"parallel.backend={config.backend!r} is not available here; use one of {', '.join(BACKENDS)} "
            "(auto picks nccl on GPUs, gloo on CPU)"
        )
    if config.timeout_s <= 0:
        raise UserError(f"parallel.timeout_s={config.timeout_s} must be > 0 seconds")

    external = environment.launcher if environment.external else None
    num_nodes = config.num_nodes
    if external:
        num_nodes = _check_against_launcher("num_nodes", num_nodes, environment.num_nodes, external)
    num_nodes = num_nodes or 1

    accelerator = "cpu" if scenario == "cpu" else "gpu"
    devices: list[int] | int
    if scenario == "cpu":
        count = _cpu_processes(config.devices)
        if external:
            count = _check_against_launcher("devices", count, environment.local_world_size, external)
        devices = count or 1
        per_node = devices
    else:
        ids = _gpu_ids(config.devices, hardware.gpus, scenario)
        if scenario == "single":
            if ids is not None and len(ids) != 1:
                raise UserError(f"parallel.devices={config.devices!r} lists {len(ids)} GPUs; 'single' takes one")
            ids = ids or [0]
        if external:
            local = environment.local_world_size
            if ids is None and local is not None:
                if local > hardware.gpus:
                    raise LaunchMismatchError(
                        f"{external} started {local} processes per node but this machine has {hardware.gpus} GPUs; "
                        f"launch at most {hardware.gpus}"
                    )
                ids = list(range(local))
            elif ids is not None:
                _check_against_launcher("devices", len(ids), local, external)
        devices = ids if ids is not None else list(range(hardware.gpus))
        per_node = len(devices)
    if scenario == "dp" and num_nodes != 1:
        raise UserError(
            f"parallel.num_nodes={num_nodes} with scenario 'dp': DataParallel is one machine; use scenario 'ddp'"
        )
    world_size = per_node * num_nodes
    if external and environment.world_size is not None and environment.world_size != world_size:
        raise LaunchMismatchError(
            f"the plan has world size {world_size} (devices {per_node} x nodes {num_nodes}) but {external} "
            f"set WORLD_SIZE={environment.world_size}; make parallel.devices x parallel.num_nodes match"
        )

    if config.sync_batchnorm and accelerator == "cpu":
        raise UserError(
            "parallel.sync_batchnorm=true needs GPUs (SyncBatchNorm does not run on CPU); "
            "set it false, or use a GPU scenario"
        )
    backend: str | None = None
    if world_size > 1:
        backend = config.backend if config.backend != "auto" else ("gloo" if accelerator == "cpu" else "nccl")
        if backend == "nccl" and accelerator == "cpu":
            raise UserError("parallel.backend='nccl' needs GPUs; use 'gloo' (or 'auto') for CPU processes")

    per_device, global_batch = _batch_sizes(scenario, config.global_batch_size, data_batch_size, world_size)
    if scenario == "dp":
        notes.append(
            "dp runs as DDP (Lightning removed DataParallel): one process per GPU instead of threads; "
            f"the global batch {global_batch} is split into {per_device} per GPU, as DataParallel's scatter did"
        )
    if scenario in ("dp", "ddp", "cpu") and world_size > 1 and not config.broadcast_buffers:
        notes.append("broadcast_buffers=false: each rank keeps its own BatchNorm running statistics between syncs")

    strategy, strategy_args = "single_device", {}
    if world_size > 1:
        start_method = "fork" if is_interactive() and not external else "popen"
        strategy = "ddp"
        strategy_args = {
            "find_unused_parameters": config.find_unused_parameters,
            # The seed's name; trainer_kwargs() passes it under the installed torch's name.
            "broadcast_buffers": config.broadcast_buffers,
            "timeout_s": config.timeout_s,
            "start_method": start_method,
        }
        if start_method == "fork":
            notes.append("interactive session: processes are started by fork")
    launcher = environment.launcher if (external or world_size > 1) else "none"
    launch, launch_notes = describe_launch(environment, per_node, num_nodes)
    notes.extend(launch_notes)
    return Plan(
        scenario=scenario,
        accelerator=accelerator,
        devices=devices,
        strategy=strategy,
        strategy_args=strategy_args,
        num_nodes=num_nodes,
        world_size=world_size,
        per_device_batch_size=per_device,
        global_batch_size=global_batch,
        backend=backend,
        launcher=launcher,
        launch=launch,
        sync_batchnorm=config.sync_batchnorm,
        notes=tuple(notes),
    )


def _batch_sizes(
    scenario: str, global_batch_size: int | None, data_batch_size: int | None, world_size: int
) -> tuple[int | None, int | None]:
    """(per-device, global) batch sizes; dp reads the data batch size as global, the others as per device."""
    for name, value in (
        ("parallel.global_batch_size", global_batch_size),
        ("data batch_size", data_batch_size),
    ):
        if value is not None and value < 1:
            raise UserError(f"{name}={value} must be >= 1")
    target = global_batch_size if global_batch_size is not None else (data_batch_size if scenario == "dp" else None)
    if target is None:
        return data_batch_size, None if data_batch_size is None else data_batch_size * world_size
    if target % world_size:
        valid = " or ".join(str(m) for m in _nearest_multiples(target, world_size))
        name = "parallel.global_batch_size" if global_batch_size is not None else "data batch_size (global under dp)"
        raise UserError(
            f"{name}={target} does not divide by the world size {world_size}; use {valid}, or change devices"
        )
    return target // world_size, target
