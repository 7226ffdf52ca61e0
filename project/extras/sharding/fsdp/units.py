"""Which modules of a LightningModule FSDP makes units of (the wrapping rule), and ``plan``'s view of them.

What is sharded: every child module of the LightningModule that holds parameters (the networks it calls,
e.g. ``.net``) is one FSDP root, and inside it each module of ``wrap_modules`` is a unit of its own (its
parameters are gathered just before its forward and freed after). Without ``wrap_modules`` the units are
the outermost modules whose class occurs more than once in the network (an MLP's layers, a transformer's
blocks): :func:`default_wrap_classes`. Parameters held by the LightningModule itself would not be
sharded nor reduced, so they are refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from torch import nn

from project.dotted import names_object
from project.errors import UserError
from project.plan.resolve import Plan
from project.plan.scenarios import SCENARIOS


def has_parameters(module: nn.Module) -> bool:
    """Whether ``module`` (or one of its submodules) holds a parameter."""
    return any(True for _ in module.parameters())


def sharded_roots(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The children of a LightningModule that FSDP shards (those with parameters: its networks).

    Raises:
        UserError: the LightningModule holds parameters itself, which FSDP would neither shard nor reduce.
    """
    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise UserError(
            f"scenario fsdp shards the networks a LightningModule holds, but {type(module).__name__} holds the "
            f"parameter(s) {', '.join(own)} itself; move them into a child nn.Module, or use scenario ddp"
        )
    return [(name, child) for name, child in module.named_children() if has_parameters(child)]


def tied_groups(roots: list[nn.Module]) -> list[list[nn.Module]]:
    """The networks in groups that share no parameter with another group (tied weights: one group, one FSDP root).

    A weight tied across two networks (``self.head.weight = self.embed.weight``) sharded as two roots would become
    two shards that train apart; ``fully_shard`` of the group as a list keeps it one parameter.
    """
    groups: list[tuple[list[nn.Module], set[int]]] = []
    for root in roots:
        ids = {id(p) for p in root.parameters()}
        joined = [group for group in groups if group[1] & ids]
        for group in joined:
            groups.remove(group)
        groups.append(([m for g in joined for m in g[0]] + [root], ids.union(*(g[1] for g in joined))))
    return [members for members, _ in groups]


def refuse_ties_across_networks(module: nn.Module) -> None:
    """Refuse a weight tied across two networks of the LightningModule, which FSDP shards as two roots.

    Raises:
        UserError: naming the tied parameters, with the fix (one network holding both, or scenario ddp).
    """
    named = sharded_roots(module)
    for group in tied_groups([root for _, root in named]):
        inner = {id(m) for root in group for m in root.modules() if m is not root}
        outer = [name for name, root in named if any(root is g for g in group) and id(root) not in inner]
        if len(outer) > 1:
            first: dict[int, str] = {}
            for name, root in named:
                for key, p in root.named_parameters():
                    first.setdefault(id(p), f"{name}.{key}")
            tied = [
                f"{name}.{key} is {first[id(p)]}"
                for name, root in named
                for key, p in root.named_parameters()
                if first[id(p)] != f"{name}.{key}"
            ]
            raise UserError(
                f"{type(module).__name__} ties weights across the networks {', '.join(outer)} ({tied[0]}), which "
                "scenario fsdp shards one by one, so the tied weight would train as two copies; hold the tied modules "
                "in one network with a forward of its own (self.net), or use scenario ddp"
            )


def tied_outside(unit: nn.Module, roots: Iterable[nn.Module]) -> bool:
    """Whether ``unit`` holds a parameter that a module outside it holds too (it cannot be a unit of its own)."""
    inside = {id(m) for m in unit.modules()}
    mine = {id(p) for p in unit.parameters()}
    return any(
        id(p) in mine and id(m) not in inside
        for root in roots
        for m in root.modules()
        for p in m.parameters(recurse=False)
    )


def _class_names(cls: type) -> set[str]:
    return {cls.__name__, f"{cls.__module__}.{cls.__qualname__}"}


def default_wrap_classes(roots: Iterable[nn.Module]) -> list[type]:
    """The outermost repeated modules' classes: an MLP's layers, a transformer's blocks (not the layers inside).

    A class qualifies when more than one of its modules (with parameters) is in the networks and a walk from
    each network's top meets it before any other repeated class; a class whose modules also sit inside another
    qualifying class's modules is dropped (a transformer's blocks, not also every Linear in and around them).
    """
    roots = list(roots)
    counts: Counter[type] = Counter()
    for root in roots:
        counts.update(type(m) for m in root.modules() if m is not root and has_parameters(m))
    found: list[type] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if counts[type(child)] > 1 and has_parameters(child):
                if type(child) not in found:
                    found.append(type(child))
            else:
                visit(child)

    for root in roots:
        visit(root)
    nested = {
        type(inner)
        for root in roots
        for outer in root.modules()
        if outer is not root and type(outer) in found
        for inner in outer.modules()
        if inner is not outer and type(inner) in found and type(inner) is not type(outer)
    }
    return [cls for cls in found if cls not in nested]


def resolve_wrap_classes(module: nn.Module, wrap_modules: list[str] | None) -> list[type]:
    """The module classes that become FSDP units: ``wrap_modules`` (names or import paths) or the default rule.

    Raises:
        UserError: a name matches no module class of the model (the message lists the classes it has).
    """
    roots = [child for _, child in sharded_roots(module)]
    if wrap_modules is None:
        return default_wrap_classes(roots)
    present = {type(m) for root in roots for m in root.modules() if has_parameters(m)}
    chosen: list[type] = []
    for name in wrap_modules:
        found = [cls for cls in present if name in _class_names(cls)]
        if not found and "." in name:
            found = [cls for cls in present if names_object(name, cls)]
        if not found:
            have = ", ".join(sorted(cls.__name__ for cls in present)) or "none"
            raise UserError(
                f"parallel.fsdp.wrap_modules lists {name!r}, but {type(module).__name__}'s networks have no module of "
                f"that class (they have: {have}); name one of those, or leave wrap_modules unset for the default"
            )
        chosen += [cls for cls in found if cls not in chosen]
    return chosen


def describe_wrapping(module: nn.Module, wrap_modules: list[str] | None) -> dict[str, Any]:
    """What ``fully_shard`` makes units of: the networks (roots), the unit classes, how many units (for ``plan``)."""
    classes = resolve_wrap_classes(module, wrap_modules)
    roots = sharded_roots(module)
    units = sum(1 for _, root in roots for m in root.modules() if m is not root and isinstance(m, tuple(classes)))
    return {
        "roots": [name for name, _ in roots],
        "classes": [cls.__name__ for cls in classes],
        "units": units,
    }


def plan_units(plan: Plan, model: nn.Module | None, wrap_modules: list[str] | None) -> dict[str, Any]:
    """``plan``'s view of the units: ``{"units": describe_wrapping(...)}`` when its strategy shards, else ``{}``.

    Under a sharding scenario it checks ``wrap_modules`` against the model at any world size (one line if wrong).
    """
    if SCENARIOS[plan.scenario].data_parallel != "shard" or model is None:
        return {}
    units = describe_wrapping(model, wrap_modules)
    return {"units": units} if plan.world_size > 1 else {}  # one process runs on a single device, unsharded
