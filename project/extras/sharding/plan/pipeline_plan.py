"""Which layers each pipeline stage holds (``parallel.pipeline_parallel``): pure, the plan prints it.

A network is cut along its *units*: its direct children in order, a ``ModuleList``/``Sequential`` child (or the
network itself when it is an ``nn.Sequential``) opened into its items (``blocks.0``, ``blocks.1``, ...). Stage
``s > 0`` begins at split point ``s - 1``: ``split_points`` as configured, else the network's own
``pipeline_split_points(stages)``, else its repeated blocks (its longest ``ModuleList``/``Sequential``) split
evenly. A stage keeps the original network with the other stages' units set to ``nn.Identity`` (torchtitan's
way), so parameter names stay those of the whole model. Works on the meta device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from torch import nn

from project.errors import UserError
from project.extras.sharding.plan.memory import human

_CONTAINERS = (nn.ModuleList, nn.Sequential)
#: The attribute names searched, in order, for the network a LightningModule's pipeline cuts.
NETWORK_ATTRIBUTES = ("net", "model", "network")


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: its index, the units (module names) it runs, in order, and their parameter count."""

    index: int
    modules: tuple[str, ...]
    parameters: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, for ``plan.json``."""
        return {"stage": self.index, "modules": list(self.modules), "parameters": self.parameters}


def pipeline_units(net: nn.Module) -> list[str]:
    """The names of ``net``'s units in forward order (containers opened one level)."""
    if isinstance(net, _CONTAINERS):
        return [name for name, _ in net.named_children()]
    units: list[str] = []
    for name, child in net.named_children():
        if isinstance(child, _CONTAINERS):
            units.extend(f"{name}.{item}" for item, _ in child.named_children())
        else:
            units.append(name)
    return units


def _repeated_blocks(net: nn.Module) -> tuple[str, list[str]]:
    """The longest container of ``net`` (``net`` itself when a Sequential): its name and its units."""
    if isinstance(net, _CONTAINERS):
        return "the network", pipeline_units(net)
    containers = [(name, child) for name, child in net.named_children() if isinstance(child, _CONTAINERS)]
    if not containers:
        return "", []
    name, child = max(containers, key=lambda item: len(item[1]))
    return name, [f"{name}.{item}" for item, _ in child.named_children()]


def default_split_points(net: nn.Module, stages: int, owner: object = None) -> list[str]:
    """The split points ``owner`` (the LightningModule) or the network names, else the repeated blocks split evenly.

    ``pipeline_split_points(stages)`` on ``owner``, then on ``net``, returns the first unit of each later stage.

    Raises:
        UserError: no repeated blocks, or fewer blocks than stages.
    """
    for holder in (owner, net):
        own = getattr(holder, "pipeline_split_points", None)
        if callable(own):
            return list(own(stages))
    name, blocks = _repeated_blocks(net)
    kind = type(net).__name__
    if not blocks:
        raise UserError(
            f"parallel.pipeline_parallel.size={stages}: {kind} has no repeated blocks (an nn.ModuleList or "
            "nn.Sequential child) to split evenly; set parallel.pipeline_parallel.split_points or give the network "
            "a pipeline_split_points(stages) method"
        )
    if len(blocks) < stages:
        raise UserError(
            f"parallel.pipeline_parallel.size={stages} is more stages than the {len(blocks)} blocks of {kind} "
            f"({name}); use at most {len(blocks)} stages or set parallel.pipeline_parallel.split_points"
        )
    return [blocks[(index * len(blocks)) // stages] for index in range(1, stages)]


def _count(net: nn.Module, names: Sequence[str], seen: set[int]) -> int:
    """Parameters of the units ``names`` not counted yet (a shared parameter counts once)."""
    total = 0
    for name in names:
        for parameter in net.get_submodule(name).parameters():
            if id(parameter) not in seen:
                seen.add(id(parameter))
                total += parameter.numel()
    return total


def network_of(module: object) -> tuple[str, nn.Module] | None:
    """The attribute name and network a pipeline cuts from ``module`` (:data:`NETWORK_ATTRIBUTES`), or ``None``."""
    for name in NETWORK_ATTRIBUTES:
        net = getattr(module, name, None)
        if isinstance(net, nn.Module):
            return name, net
    return None


def plan_stages(module: object, stages: int, split_points: Sequence[str] | None = None) -> list[StagePlan]:
    """The stages of a LightningModule's network (``plan`` prints them; the meta device will do).

    Raises:
        UserError: the module has no network attribute, or the split cannot be made (:func:`assign_stages`).
    """
    found = network_of(module)
    if found is None:
        raise UserError(
            f"parallel.pipeline_parallel.size={stages}: {type(module).__name__} has no network attribute to cut "
            f"into stages (one of {', '.join('self.' + name for name in NETWORK_ATTRIBUTES)}, an nn.Module); "
            "keep the network there or set parallel.pipeline_parallel.size 1"
        )
    return assign_stages(found[1], stages, split_points, owner=module)


def assign_stages(
    net: nn.Module, stages: int, split_points: Sequence[str] | None = None, owner: object = None
) -> list[StagePlan]:
    """The stages' units and parameter counts for ``stages`` pipeline stages of ``net`` (held by ``owner``).

    Raises:
        UserError: an unknown split point, split points out of order or of the wrong count, or a stage
            without units (one line naming the value, the rule and the fix).
    """
    units = pipeline_units(net)
    points = list(split_points) if split_points is not None else default_split_points(net, stages, owner)
    setting = "parallel.pipeline_parallel.split_points"
    if len(points) != stages - 1:
        raise UserError(
            f"{setting}={points} names {len(points)} split points; {stages} stages need {stages - 1} "
            "(the first unit of each stage after the first)"
        )
    for point in points:
        if point not in units:
            shown = ", ".join(units[:12]) + (", ..." if len(units) > 12 else "")
            raise UserError(f"{setting}: {point!r} is not a unit of {type(net).__name__}; choose among {shown}")
    starts = [0, *(units.index(point) for point in points), len(units)]
    if any(later <= earlier for earlier, later in pairwise(starts)):
        raise UserError(
            f"{setting}={points} must name units in forward order, each stage at least one unit "
            f"(the order is {', '.join(units[:12])}...)"
        )
    seen: set[int] = set()
    result = []
    for index in range(stages):
        names = tuple(units[starts[index] : starts[index + 1]])
        result.append(StagePlan(index, names, _count(net, names, seen)))
    return result


def shared_across_stages(net: nn.Module, plan: Sequence[StagePlan]) -> str | None:
    """The name of a parameter two stages would share (tied weights), or ``None``."""
    owner: dict[int, int] = {}
    for stage in plan:
        for unit in stage.modules:
            for name, parameter in net.get_submodule(unit).named_parameters():
                if owner.setdefault(id(parameter), stage.index) != stage.index:
                    return f"{unit}.{name}"
    return None


def describe_stages(module: object, stages: int, args: dict[str, Any], memory: dict[str, Any] | None) -> dict[str, Any]:
    """``plan``'s view of the pipeline: its size, schedule, and each stage's units, parameters and state bytes.

    A stage holds its share of the parameters, with their gradients and optimizer state (the ``ddp`` column of the
    memory table, per device, in proportion).
    """
    described = [stage.to_dict() for stage in plan_stages(module, stages, args["split_points"])]
    if memory is not None:
        total, parameters = memory["per_device"]["ddp"]["total"]["bytes"], max(memory["model"]["parameters"], 1)
        for stage in described:
            stage["state_bytes"] = human(round(total * int(stage["parameters"]) / parameters))
    return {"size": stages, "schedule": args["schedule"], "microbatches": args["microbatches"], "stages": described}
