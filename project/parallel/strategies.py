"""The Trainer's strategy built from the plan's row, inside the ranks (the table itself is pure: ``project.plan``).

A row names its builder (``module:function``), which gets the plan's arguments, backend and Layout. Callbacks,
checkpoints and export ask :func:`row_of` what the running strategy does and :func:`layout_of` its degrees.
"""

from __future__ import annotations

from typing import Any

from project.dotted import import_object
from project.plan.layout import Layout
from project.plan.resolve import Plan
from project.plan.strategies import STRATEGIES, StrategyRow

#: The row of a strategy the template did not build (``parallel: null``), by its Lightning class; else unsharded.
LIGHTNING_ROWS = {row.lightning_class: row for row in STRATEGIES.values() if row.lightning_class is not None}
UNSHARDED = STRATEGIES["ddp"]
#: The attribute a strategy built from a row carries its row name in, and the one it carries its layout in.
ROW_ATTRIBUTE = "project_strategy_row"
LAYOUT_ATTRIBUTE = "project_layout"


def build_auto(args: dict[str, Any], backend: str | None, layout: Layout) -> Any:
    """One process: Lightning picks the single-device strategy for the accelerator and device given."""
    return "auto"


def build_strategy(plan: Plan) -> Any:
    """The Trainer's ``strategy`` for ``plan``, from its row's builder (and the plan's cluster environment, if any)."""
    strategy = import_object(plan.row.build)(plan.strategy_args, plan.backend, plan.layout)
    if not isinstance(strategy, str):
        setattr(strategy, ROW_ATTRIBUTE, plan.strategy)
        setattr(strategy, LAYOUT_ATTRIBUTE, plan.layout)
        if plan.cluster_environment is not None:
            strategy.cluster_environment = import_object(plan.cluster_environment)()
    return strategy


def trainer_kwargs(plan: Plan) -> dict[str, Any]:
    """Keyword arguments for ``lightning.Trainer`` (they replace accelerator/devices/strategy/...)."""
    return {
        "accelerator": plan.accelerator,
        "devices": plan.devices,
        "num_nodes": plan.num_nodes,
        "strategy": build_strategy(plan),
        "sync_batchnorm": plan.sync_batchnorm,
        "accumulate_grad_batches": plan.loader_batches[1],
        "precision": plan.precision,
    }


def row_of(strategy: Any) -> StrategyRow:
    """What the running strategy does: its row when the template built it, else the row of its Lightning class."""
    name = getattr(strategy, ROW_ATTRIBUTE, None)
    if name in STRATEGIES:
        return STRATEGIES[name]
    return next((LIGHTNING_ROWS[c.__name__] for c in type(strategy).__mro__ if c.__name__ in LIGHTNING_ROWS), UNSHARDED)


def built_from_plan(strategy: Any) -> bool:
    """Whether ``strategy`` was built from a row of the plan (the ``parallel`` section), not given by the user."""
    return getattr(strategy, ROW_ATTRIBUTE, None) in STRATEGIES


def layout_of(trainer: Any) -> Layout:
    """The running layout: the plan's, else a user's strategy's (data parallel but for a tensor-parallel mesh)."""
    if isinstance(layout := getattr(trainer.strategy, LAYOUT_ATTRIBUTE, None), Layout):
        return layout
    mesh = getattr(trainer.strategy, "device_mesh", None)
    names = (mesh.mesh_dim_names or ()) if mesh is not None else ()
    tp = mesh["tensor_parallel"].size() if "tensor_parallel" in names else 1
    world, nodes = max(trainer.world_size, 1), max(trainer.num_nodes, 1)
    return Layout("trainer.strategy", trainer.accelerator.__class__.__name__, world // nodes, nodes, world // tp, tp=tp)
