"""The optional layers: one folder each under ``project/extras/``, plugged into the core's tables.

The core names no layer. It lists the ``extras`` folder beside this file and reads each sub-folder's
``layer.py``, whose ``LAYER`` says what the layer adds: command rows, config sections, callbacks, a hook on the
built Trainer. Everything a row or hook points to is an import path, imported only when it is used, so listing the
layers costs no Lightning import (``python -m project --help`` reads the command rows). Removing a layer's folder
(``make strip EXTRAS=name``) removes its rows, sections and callbacks with it; nothing in the core changes.

A ``layer.py`` imports only this module, :mod:`project.commands` and the standard library.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

#: Where the layers live, as a folder beside this module (the only place the core says where they are).
EXTRAS = Path(__file__).resolve().parent / "extras"


@dataclass(frozen=True)
class Layer:
    """What one layer adds to the core; every hook is an import path (``package.module:function``).

    Attributes:
        name: The layer's folder (``sweep``).
        adds: One line for ``make strip``'s table: what the layer adds to the template.
        commands: Rows of the command table (a runner or an argument hook named by import path).
        sections: ``add(parser)`` hooks: config sections or options every command's parser takes.
        callbacks: ``callbacks(state, row, config) -> list[Callback]`` hooks, run for every Trainer the CLI builds,
            after the template's own callbacks (a self-test's Trainer keeps them too).
        on_trainer: ``hook(trainer, config, chosen, row)`` run on the built Trainer (e.g. a logger beside it).
        requires: Other layers this one imports (``make strip`` removes it with any of them).
        run_stores: :class:`project.run_store.RunStore` subclasses serving run directories given as URLs (each
            its ``schemes``), instantiated once when a command first needs one.
        around_plan: ``hook(section, environment, resuming, row)``: a context manager around the resolution of the
            plan that yields the ``parallel`` section to resolve (elastic: a restart keeps the checkpoint's global
            batch; ``resuming``: the loaders' state in the checkpoint) and sees the plan's refusal (elastic: the job
            ends in one line instead of being restarted).
        explain_stall: ``hook(why) -> str | None``: the line naming which rank is where when the ranks stalled (the
            hang report). ``why`` given: a collective or barrier timed out on this rank, every rank is asked now;
            ``None``: only a stall already recorded (a lost peer that ended at its timeout).
        observe_wait: ``hook(op, group, timeout_s)``: a context manager around a wait of the template's own that
            torch's Flight Recorder does not see (the barrier's ``monitored_barrier``), so a stall there is seen.
        trusted_modules: Modules (with their submodules) whose networks an export's ``model.json`` may name:
            ``rebuild`` imports them unasked, as it does the core's ``project.models`` (rows, not hooks).
        network_exports: ``module:Class`` of an export for a network that no class path rebuilds
            (the export layer's ``NetworkExport``): written with the export at the end of ``fit``, read by ``rebuild``.
        around_command: ``hook(argv) -> context manager`` that ``python -m project`` runs the command inside, after
            its imports (early: the ranks of a CPU run forked there).
        submit: ``hook(launcher) -> run | None``: how this process submits its job to ``parallel.launcher``, a
            launcher that did not start it (ray: a Ray Train job); ``run(argv, command, plan, run_in_worker)``.
        on_state: ``hook(state, config)`` on the run's state before its plan is resolved: a layer takes a value of
            the ``parallel`` section only it understands (``state.section``) and changes every plan the run makes
            (``state.amend``; microbatch: ``micro_batch: auto``).
        scenarios: ``() -> dict[str, Scenario]``: rows of the scenario table (:mod:`project.plan.scenarios`).
        strategies: ``() -> dict[str, StrategyRow]``: rows of the strategy table (:mod:`project.plan.strategies`).
        parallel: ``() -> dict[str, type]``: subsections of the ``parallel`` section (dataclasses, by field name).
        degrees: ``(config, layout) -> Layout``: the layout (data parallel over every process) with the degrees
            a layer's subsection decides (``tp``, ``pp``; replicas of a sharded scenario), checked.
        plan_notes: ``(config, layout, strategy, start_method) -> list[str]``: the plan's notes on a layer's
            subsection (refusing what the layout cannot do).
        plan_report: ``(cli, plan, data) -> (dict, list)``: ``plan``'s own parts: keys added to ``data`` (its
            ``strategy`` entry too) and the JSON's extra top-level keys, and what the table prints after it.
        checkpoint_formats: A class whose instances read and write a checkpoint that is not one file
            (:class:`project.checkpoints.formats.CheckpointFormat`).
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
    # Each layer.py imports the command table, which lists the layers: loaded first, it is whole when they ask it
    # (a hook asked before any command was read, e.g. the barrier in a plain process, would find it half-imported).
    importlib.import_module(f"{__package__}.commands")
    found = []
    for folder in sorted(EXTRAS.iterdir()) if EXTRAS.is_dir() else ():
        if (folder / "layer.py").is_file():
            module = importlib.import_module(f"{__package__}.extras.{folder.name}.layer")
            found.append(module.LAYER)
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
    for function in hooks(kind):
        answer = function(*args)
        if answer is not None:
            return answer
    return None


@contextlib.contextmanager
def observed(kind: str, *args: Any) -> Iterator[None]:
    """Inside every installed layer's context manager of one kind (``observe_wait``); none installed: as is."""
    with contextlib.ExitStack() as stack:
        for function in hooks(kind):
            stack.enter_context(function(*args))
        yield


def rows(kind: str) -> dict[str, Any]:
    """Every installed layer's rows of one table (``scenarios``, ``strategies``, ``parallel``), in layer order."""
    merged: dict[str, Any] = {}
    for contribute in hooks(kind):
        merged.update(contribute())
    return merged
