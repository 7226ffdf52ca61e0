"""The optional layers: one folder each under ``project/extras/``, plugged into the core's tables.

The core names no layer: each ``extras/<name>/layer.py`` has a ``LAYER`` saying what it adds, its hooks imported
only when used, so listing the layers imports no Lightning. ``make strip EXTRAS=name`` removes a layer's folder and
all it adds. A ``layer.py`` imports only this module, :mod:`project.commands` and the standard library.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

#: Where the layers live (the only place the core says so).
EXTRAS = Path(__file__).resolve().parent / "extras"


@dataclass(frozen=True)
class Layer:
    """What one layer adds to the core (tabled in docs/development.md); each hook an import path (``module:function``).

    Attributes:
        name: The layer's folder (``sweep``).
        adds: One line for ``make strip``'s table: what the layer adds to the template.
        commands: Rows of the command table (a runner or an argument hook named by import path).
        sections: ``add(parser)`` hooks: config sections or options every command's parser takes.
        callbacks: ``(state, row, config) -> list[Callback]`` for every Trainer, after the template's (self-tests too).
        on_trainer: ``hook(trainer, config, chosen, row)`` run on the built Trainer (e.g. a logger beside it).
        requires: Other layers this one imports (``make strip`` removes it with any of them).
        run_stores: :class:`project.run_store.RunStore` subclasses serving run directories given as URLs (``schemes``).
        around_plan: ``hook(section, environment, resuming, row)``: a context manager around the plan's resolution
            yielding the ``parallel`` section to resolve and seeing its refusal (elastic: a restart's global batch).
        explain_stall: ``hook(why) -> str | None``: the line naming which rank is where at a stall (the hang report);
            ``why`` given: a wait timed out here, ask every rank now; ``None``: only a stall already recorded.
        observe_wait: ``hook(op, group, timeout_s)``: a context manager around a wait Flight Recorder does not see.
        trusted_modules: Modules whose networks an export's ``model.json`` may name: ``rebuild`` imports them unasked.
        network_exports: ``module:Class`` of an export for a network no class path rebuilds (written by ``fit``).
        around_command: ``hook(argv) -> context manager`` the command runs inside, after the imports (early's forks).
        submit: ``hook(launcher) -> run | None``: submits this job to a ``parallel.launcher`` that did not start it
            (ray); ``run(argv, command, plan, run_in_worker)``.
        on_state: ``hook(state, config)`` before the plan: takes a ``parallel`` value only it knows, amends every plan.
        scenarios: ``() -> dict[str, Scenario]``: rows of the scenario table (:mod:`project.plan.scenarios`).
        strategies: ``() -> dict[str, StrategyRow]``: rows of the strategy table (:mod:`project.plan.strategies`).
        parallel: ``() -> dict[str, type]``: subsections of the ``parallel`` section (dataclasses, by field name).
        degrees: ``(config, layout) -> Layout``: the layout with the degrees a layer's subsection decides, checked.
        plan_notes: ``(config, layout, strategy, start_method) -> list[str]``: the plan's notes on its subsection.
        plan_report: ``(cli, plan, data) -> (dict, list)``: ``plan``'s own JSON keys and lines after its table.
        checkpoint_formats: Classes answering :class:`project.checkpoints.formats.CheckpointFormat` (not one file).
    """

    name: str
    adds: str
    commands: tuple[Any, ...] = ()  # project.commands.Command rows (commands.py imports this module)
    sections: tuple[str, ...] = ()
    callbacks: tuple[str, ...] = ()
    on_trainer: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    run_stores: tuple[str, ...] = ()
    around_plan: tuple[str, ...] = ()
    explain_stall: tuple[str, ...] = ()
    observe_wait: tuple[str, ...] = ()
    trusted_modules: tuple[str, ...] = ()
    network_exports: tuple[str, ...] = ()
    around_command: tuple[str, ...] = ()
    submit: tuple[str, ...] = ()
    on_state: tuple[str, ...] = ()
    scenarios: tuple[str, ...] = ()
    strategies: tuple[str, ...] = ()
    parallel: tuple[str, ...] = ()
    degrees: tuple[str, ...] = ()
    plan_notes: tuple[str, ...] = ()
    plan_report: tuple[str, ...] = ()
    checkpoint_formats: tuple[str, ...] = ()


@cache
def installed() -> tuple[Layer, ...]:
    """The layers present in this checkout, by folder name (a folder without ``layer.py`` is not a layer)."""
    # Each layer.py imports the command table, which lists the layers: imported first, it is whole when they ask it
    # (a hook asked before any command was read, e.g. the barrier in a plain process, would find it half-imported).
    importlib.import_module(f"{__package__}.commands")
    found = []
    for folder in sorted(EXTRAS.iterdir()) if EXTRAS.is_dir() else ():
        if (folder / "layer.py").is_file():
            found.append(importlib.import_module(f"{__package__}.extras.{folder.name}.layer").LAYER)
    return tuple(found)


def hook(path: str) -> Callable[..., Any]:
    """The function an import path (``package.module:function``) names, imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def hooks(kind: str) -> list[Callable[..., Any]]:
    """Every installed layer's hooks of one kind (``sections``, ``callbacks``, ``run_stores``...), in layer order."""
    return [hook(path) for layer in installed() for path in getattr(layer, kind)]


def first_answer(kind: str, *args: Any) -> Any:
    """The first answer that is not ``None`` of the layers' hooks of one kind (``explain_stall``), else ``None``."""
    return next((answer for function in hooks(kind) if (answer := function(*args)) is not None), None)


@contextlib.contextmanager
def observed(kind: str, *args: Any) -> Iterator[None]:
    """Inside every installed layer's context manager of one kind (``observe_wait``); none installed: as is."""
    with contextlib.ExitStack() as stack:
        for function in hooks(kind):
            stack.enter_context(function(*args))
        yield


def rows(kind: str) -> dict[str, Any]:
    """Every installed layer's rows of one table (``scenarios``, ``strategies``, ``parallel``), in layer order."""
    return {key: row for contribute in hooks(kind) for key, row in contribute().items()}
