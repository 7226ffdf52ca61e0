"""The bench's parts that layers add: one folder each under ``bench/extras/<layer>/``, found on disk.

The bench names no layer (``make strip`` deletes ``bench/extras/<layer>/`` with the layer). A layer's folder may hold

- ``task.py``: a workload task beside ``classification``: ``TASK`` (its name in
  ``Workload.task`` and ``--task``), ``BASE_CONFIG``, ``DATA_CLASS``, ``net_args(workload)``,
  ``data_args(workload)``, ``model_config(workload)`` (the template's ``model`` section), ``network(hidden,
  block_size, in_features)`` (the network and loss of the raw and plain ways), ``training_set(data, block_size)`` (their
  dataset of the harness's file and its ``collate_fn``) and, for rows cut into pipeline stages,
  ``RAW_PIPELINE`` (the raw pipelining loop, relative to the repository), and ``default_rows(quick, gpu)`` where
  its rows join the bench's own run (the regression's);
- ``rows.py``: options of ``python -m bench`` that pick its own rows: ``add_arguments(parser)``,
  ``chosen(args)`` (where a full run's results go when its options are given, else ``None``), ``rows(args, quick,
  gpu)``, and ``GPU_CHECK`` (``bench.gpu_check --workload`` name -> the GPU's workload and the dry run's).

No Lightning import here: ``bench/raw.py`` reads the tasks.
"""

from __future__ import annotations

import importlib
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

#: Where the layers' parts of the bench live (the only place the bench says where they are).
EXTRAS = Path(__file__).resolve().parent / "extras"


def _modules(name: str) -> tuple[ModuleType, ...]:
    """Each layer's module ``name`` (``task``, ``rows``), in folder order."""
    found = sorted(EXTRAS.glob(f"*/{name}.py")) if EXTRAS.is_dir() else []
    return tuple(importlib.import_module(f"bench.extras.{path.parent.name}.{name}") for path in found)


@cache
def tasks() -> dict[str, ModuleType]:
    """The layers' workload tasks by name (``chargpt``: the GPT layer's, when it is there)."""
    return {module.TASK: module for module in _modules("task")}


def task(name: str) -> ModuleType | None:
    """The layer's task called ``name``; ``None`` for the bench's own (``classification``)."""
    return tasks().get(name)


@cache
def row_sets() -> tuple[ModuleType, ...]:
    """The layers' ``rows.py`` modules: their options of ``python -m bench`` and the rows those pick."""
    return _modules("rows")


def default_rows(quick: bool, gpu: bool) -> list[Any]:
    """The layers' rows that join the bench's own run (``default_rows`` of their ``task.py``), in folder order."""
    found = [module for module in tasks().values() if hasattr(module, "default_rows")]
    return [row for module in found for row in module.default_rows(quick, gpu)]


def raw_pipeline(name: str) -> str:
    """The raw pipelining loop of task ``name`` (relative to the repository).

    Raises:
        ValueError: a task without one (only a layer's task can be cut into pipeline stages here).
    """
    script = getattr(task(name), "RAW_PIPELINE", None)
    if script is None:
        raise ValueError(f"task {name!r} has no raw pipelining loop (RAW_PIPELINE in its task.py)")
    return script
