"""What a tracked run holds already, so that a restart adds to it without repeating or contradicting it.

Pure (no mlflow, no Lightning): the steps each metric reached, the parameters as first logged, and the plan's
parameters read from ``plan.json``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: MLflow's limit on a parameter value (mlflow >= 2.x); longer values are cut, as Lightning's logger does at 250.
PARAM_VALUE_LIMIT = 6000
#: The characters MLflow allows in a metric name: Lightning's MLFlowLogger drops the others, so the marks do too.
_METRIC_NAME = re.compile(r"[^a-zA-Z0-9_/. -]+")
#: plan.json's entries that are not parameters of the run: free text, the guarantees, the launch, the runtime.
_NOT_PARAMETERS = ("notes", "guarantees", "launch", "runtime", "capabilities")
#: The tag that records a parameter's later value: MLflow parameters cannot change (``changed/plan/world_size``).
CHANGED_PREFIX = "changed/"


def metric_name(key: str) -> str:
    """``key`` as MLflow stores it (Lightning's logger removes the characters MLflow refuses)."""
    return _METRIC_NAME.sub("", key)


class StepMarks:
    """The highest step logged per metric: a step at or below it is never logged again.

    A run killed after its last checkpoint logged steps that the resumed run logs once more (the resume is exact,
    so with the same values); Lightning also logs ``epoch`` with every dict, twice at one step.

    Args:
        marks: The highest step per metric already in the store (read once when a run is reopened).
    """

    def __init__(self, marks: Mapping[str, int] | None = None) -> None:
        self.marks = dict(marks or {})

    def keep(self, metrics: Mapping[str, Any], step: int) -> dict[str, Any]:
        """The entries of ``metrics`` not logged at ``step`` or later yet; they are marked as logged."""
        kept = {}
        for key, value in metrics.items():
            name = metric_name(key)
            if step > self.marks.get(name, -1):
                self.marks[name] = step
                kept[key] = value
        return kept


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested parameters as ``a/b/c -> str(value)`` (Lightning's logger joins nested keys with ``/`` too)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = str(value)[:PARAM_VALUE_LIMIT]
    return flat


def split_params(
    params: Mapping[str, str], stored: Mapping[str, str], tags: Mapping[str, str], step: int
) -> tuple[dict[str, str], dict[str, str]]:
    """The parameters to log and the tags that record changed ones: the first value stays, the new one is a tag.

    A resume on another world size changes ``plan/world_size``; MLflow refuses to change a parameter, so the
    first value stays and ``changed/plan/world_size`` says ``1 from step 10``, each time the value in effect changes.

    Args:
        params: The flat parameters of this process.
        stored: The run's parameters so far.
        tags: The run's tags so far (the ``changed/`` ones say the value in effect).
        step: The step this process started from.
    """
    new = {key: value for key, value in params.items() if key not in stored}
    changed: dict[str, str] = {}
    for key, value in params.items():
        if key in new:
            continue
        recorded = tags.get(CHANGED_PREFIX + key)
        in_effect = recorded.rsplit(" from step ", 1)[0] if recorded is not None else stored[key]
        if value != in_effect:
            changed[CHANGED_PREFIX + key] = f"{value} from step {step}"
    return new, changed


def plan_params(record: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved plan as parameters (scenario, world size, batch, accumulation, precision, devices ...).

    Args:
        record: ``plan.json`` as :class:`project.callbacks.run_record.RunRecordCallback` wrote it.
    """
    return {key: value for key, value in record.items() if key not in _NOT_PARAMETERS}
