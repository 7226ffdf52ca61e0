"""Where the processes go: the scenario, the devices of each node, the nodes, checked against the launcher."""

from __future__ import annotations

from dataclasses import dataclass

from project.errors import UserError
from project.layers import hooks
from project.plan.config import Hardware, ParallelConfig
from project.plan.devices import DeviceRequest, cpu_processes, gpu_ids, parse_devices
from project.plan.environment import LaunchEnvironment
from project.plan.scenarios import AUTO_SCENARIO, SCENARIOS

# Where an outside launcher's numbers come from, for messages that say what to change.
_LAUNCHER_SOURCES = {
    "slurm": {"devices": "--ntasks-per-node (SLURM_NTASKS_PER_NODE)", "num_nodes": "--nodes (SLURM_NNODES)"},
    "kubeflow": {"devices": "one process per pod", "num_nodes": "the PyTorchJob's replicas (WORLD_SIZE)"},
    "ray": {"devices": "the workers Ray placed on this node (LOCAL_WORLD_SIZE)", "num_nodes": "Ray's placement"},
}
_ELASTIC_SOURCES = {
    "devices": "--nproc_per_node (LOCAL_WORLD_SIZE)",
    "num_nodes": "--nnodes (WORLD_SIZE / LOCAL_WORLD_SIZE)",
}


class LaunchMismatchError(UserError):
    """The config asks for another layout than the outside launcher (torchrun, SLURM) started."""


#: The mesh's dimensions, outermost first (torchtitan's order); a rank's coordinates on them are row-major.
MESH_DIMS: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class Layout:
    """The scenario, devices per node, nodes, and the parallel degrees, whose product is the world size."""

    scenario: str
    accelerator: str
    devices: list[int] | int
    num_nodes: int
    dp_replicate: int
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        product = self.pp * self.dp_replicate * self.dp_shard * self.tp
        if product != self.world_size:
            raise UserError(
                f"parallel degrees pipeline {self.pp} x replicate {self.dp_replicate} x shard {self.dp_shard} x "
                f"tensor {self.tp} = {product} do not match the world size {self.world_size} "
                f"({self.per_node} per node x {self.num_nodes} nodes)"
            )

    @property
    def dp_size(self) -> int:
        """Data-parallel degree (replicas x shards): what samplers, seeds and messages ask, never the world size."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_size_name(self) -> str:
        """What messages call the data-parallel size: the world size, unless model parallelism shares data."""
        return "world size" if self.dp_size == self.world_size else "data-parallel size"

    def size(self, dim: str) -> int:
        """The degree of one mesh dimension by name (one of :data:`MESH_DIMS`)."""
        return int(getattr(self, dim))

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits on each dimension of the mesh (row-major over :data:`MESH_DIMS`)."""
        place: dict[str, int] = {}
        for dim in reversed(MESH_DIMS):
            rank, place[dim] = divmod(rank, self.size(dim))
        return {dim: place[dim] for dim in MESH_DIMS}

    def dp_rank(self, rank: int) -> int:
        """The data-parallel rank of global ``rank``: a tensor-parallel group and a pipeline's stages share data."""
        where = self.coordinates(rank)
        return where["dp_replicate"] * self.dp_shard + where["dp_shard"]

    def pp_rank(self, rank: int) -> int:
        """The pipeline stage global ``rank`` runs (0 without pipeline parallelism)."""
        return self.coordinates(rank)["pp"]

    def group_ranks(self, dims: tuple[str, ...]) -> list[list[int]]:
        """The groups of ranks that differ only along ``dims`` (``("pp",)``: each pipeline's stages), sorted."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            where = self.coordinates(rank)
            groups.setdefault(tuple(where[dim] for dim in MESH_DIMS if dim not in dims), []).append(rank)
        return sorted(groups.values())

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The device mesh's sizes and names, outermost first, without the dimensions of degree 1 (at least one)."""
        kept = [dim for dim in MESH_DIMS if self.size(dim) > 1] or ["dp_replicate"]
        return tuple(self.size(dim) for dim in kept), tuple(kept)

    def to_dict(self) -> dict[str, int]:
        """The degrees by name, JSON-ready (``plan.json``'s ``degrees``); never passed between modules."""
        return {dim: self.size(dim) for dim in MESH_DIMS} | {"dp": self.dp_size}

    @property
    def per_node(self) -> int:
        """Processes on each node: one per GPU id, or the CPU process count."""
        return len(self.devices) if isinstance(self.devices, list) else self.devices

    @property
    def world_size(self) -> int:
        """All processes of the job."""
        return self.per_node * self.num_nodes


def resolve_scenario(config: ParallelConfig, request: DeviceRequest, hardware: Hardware) -> str:
    """``auto`` made concrete for this machine; a GPU scenario without GPUs is refused."""
    if config.scenario != AUTO_SCENARIO:
        if SCENARIOS[config.scenario].devices == "gpu" and hardware.gpus == 0:
            asked = f" with devices={config.devices!r}" if config.devices is not None else ""
            raise UserError(
                f"parallel.scenario={config.scenario!r}{asked} needs GPUs but no GPU is visible; "
                "use scenario 'cpu' (devices N runs N processes), or plan with --assume_gpus N"
            )
        return config.scenario
    if hardware.gpus == 0:
        return "cpu"
    return "ddp" if hardware.gpus > 1 and request.size != 1 else "single"


def _launcher_value(name: str, asked: int | None, given: int | None, launcher: str | None) -> int | None:
    """An outside launcher (``None``: none) fixes the layout: take its number, or refuse a config that disagrees."""
    if launcher is None or given is None:
        return asked
    if asked is not None and asked != given:
        source = _LAUNCHER_SOURCES.get(launcher, _ELASTIC_SOURCES)[name]
        raise LaunchMismatchError(
            f"parallel.{name}={asked} disagrees with {launcher}, which started {given} ({source}); "
            f"set parallel.{name} to {given} or drop it to take the launcher's value"
        )
    return given


def _gpu_devices(
    scenario: str, request: DeviceRequest, hardware: Hardware, environment: LaunchEnvironment
) -> list[int]:
    ids = gpu_ids(request, hardware.gpus)
    if SCENARIOS[scenario].max_gpus == 1:
        if ids is not None and len(ids) != 1:
            raise UserError(f"parallel.devices={request.raw!r} lists {len(ids)} GPUs; {scenario!r} takes one")
        ids = ids or [0]
    if environment.external:
        local = environment.local_world_size
        if ids is None and local is not None:
            if local > hardware.gpus:
                raise LaunchMismatchError(
                    f"{environment.launcher} started {local} processes per node but this machine has "
                    f"{hardware.gpus} GPUs; launch at most {hardware.gpus}"
                )
            ids = list(range(local))
        elif ids is not None:
            _launcher_value("devices", len(ids), local, environment.launcher)
    return ids if ids is not None else list(range(hardware.gpus))


def resolve_layout(config: ParallelConfig, hardware: Hardware, environment: LaunchEnvironment) -> Layout:
    """Scenario, devices and nodes for this machine and launcher; every invalid combination is a one-line error."""
    request = parse_devices(config.devices)
    scenario = resolve_scenario(config, request, hardware)
    if config.num_nodes is not None and config.num_nodes < 1:
        raise UserError(f"parallel.num_nodes={config.num_nodes} must be >= 1")
    external = environment.launcher if environment.external else None
    num_nodes = _launcher_value("num_nodes", config.num_nodes, environment.num_nodes, external) or 1
    devices: list[int] | int
    row = SCENARIOS[scenario]
    if row.devices == "cpu" or (row.devices == "any" and hardware.gpus == 0):
        count = _launcher_value("devices", cpu_processes(request, scenario), environment.local_world_size, external)
        devices, accelerator = count or 1, "cpu"
    else:
        devices, accelerator = _gpu_devices(scenario, request, hardware, environment), "gpu"
    if row.max_nodes is not None and num_nodes > row.max_nodes:
        raise UserError(
            f"parallel.num_nodes={num_nodes} with scenario {scenario!r}: DataParallel is one machine; use "
            "scenario 'ddp'"
        )
    world_size = (len(devices) if isinstance(devices, list) else devices) * num_nodes
    replicas, shards = (1, world_size) if row.data_parallel == "shard" else (world_size, 1)
    layout = Layout(scenario, accelerator, devices, num_nodes, dp_replicate=replicas, dp_shard=shards)
    if external and environment.world_size is not None and environment.world_size != world_size:
        raise LaunchMismatchError(
            f"the plan has world size {world_size} (devices {layout.per_node} x nodes {num_nodes}) but {external} "
            f"set WORLD_SIZE={environment.world_size}; make parallel.devices x parallel.num_nodes match"
        )
    for with_degrees in hooks("degrees"):  # the model-parallel degrees a layer's subsection asks for, checked
        layout = with_degrees(config, layout)
    return layout
