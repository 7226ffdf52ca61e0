"""The layer's ``callbacks`` hook: a :class:`PredictionsWriter` for each ``predict`` that lists no writer."""

from __future__ import annotations

from typing import Any

from lightning import Callback
from lightning.pytorch.callbacks import BasePredictionWriter

from project.dotted import import_object
from project.extras.predictions.writer import PredictionsWriter, lists_prediction_writer


def _listed_classes(config: Any) -> list[Any]:
    """What ``trainer.callbacks`` lists, before the CLI instantiates it: each entry's class, or the entry itself."""
    trainer = config.get("trainer") if config is not None else None
    listed = trainer.get("callbacks") if trainer is not None else None
    listed = listed if isinstance(listed, (list, tuple)) else [listed]
    found = []
    for entry in listed:
        path = entry.get("class_path") if hasattr(entry, "get") else None
        try:
            found.append(import_object(path) if isinstance(path, str) else entry)
        except (ImportError, AttributeError, ValueError):  # the CLI reports a class path it cannot import
            continue
    return found


def lists_writer_class(config: Any) -> bool:
    """Whether the config's ``trainer.callbacks`` names a prediction writer (a class path or an instance)."""
    classes = _listed_classes(config)
    named = any(isinstance(cls, type) and issubclass(cls, BasePredictionWriter) for cls in classes)
    return named or lists_prediction_writer(classes)


def prediction_callbacks(state: Any, row: Any, config: Any) -> list[Callback]:
    """``predict`` (the command whose Trainer method is ``predict``): the writer, unless the config lists one."""
    if row.trainer_method != "predict" or lists_writer_class(config):
        return []
    return [PredictionsWriter()]
