"""A ``predict_step`` output split into one row of cells per sample, and the rows as ``predictions.csv`` text.

Pure data handling, no Lightning and no processes: which outputs split into per-sample columns and how those
columns are named and written is the format of :mod:`project.extras.predictions.writer` (its module docstring);
what cannot be split is an :class:`Unsplittable` naming why.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from project.errors import UserError

_PLAIN = (str, int, float, bool, type(None), np.generic)


class Unsplittable(UserError):
    """A ``predict_step`` output that cannot be written as one row per sample."""


def _is_array(value: Any) -> bool:
    """A tensor or NumPy array with a first dimension to split."""
    return isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim > 0


def _is_plain(value: Any) -> bool:
    """One sample's value of a per-sample list: a string, a number, or a 0-dim tensor or array."""
    return isinstance(value, _PLAIN) or (isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0)


def _is_values(value: Any) -> bool:
    """A list of plain values: one per sample (a tuple is one column per position, as a tuple of tensors is)."""
    return isinstance(value, list) and len(value) > 0 and all(_is_plain(v) for v in value)


def describe(value: Any, depth: int = 0) -> str:
    """What ``value`` is, short, for an error: ``a tensor of shape [16, 3]``, ``a dict {'label': a list of 15 str}``."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {list(value.shape)}"
    if _is_values(value):
        kinds = "/".join(sorted({type(v).__name__ for v in value}))
        return f"a {type(value).__name__} of {len(value)} {kinds}"
    if depth > 2:  # an error line, not a dump of the structure
        return f"a {type(value).__name__}"
    if isinstance(value, Mapping):
        items = ", ".join(f"{key!r}: {describe(sub, depth + 1)}" for key, sub in list(value.items())[:6])
        return f"a dict {{{items}{', ...' if len(value) > 6 else ''}}}"
    if isinstance(value, (list, tuple)) and len(value) > 3:  # a count, not a dump: the line stays short
        kinds = "/".join(sorted({type(v).__name__ for v in value}))
        return f"a {type(value).__name__} of {len(value)} {kinds}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(describe(sub, depth + 1) for sub in value)
        return f"a {type(value).__name__} ({items}{', ...' if len(value) > 6 else ''})"
    return f"a {type(value).__name__}"


def _is_per_sample_arrays(value: Any, batch_size: int | None) -> bool:
    """A list of one tensor/array per sample, of varying shapes (token ids, boxes): one column, a JSON list a cell.

    A list of arrays that each hold the whole batch (first dimension = the batch) is one column per position.
    """
    return (
        isinstance(value, list)
        and batch_size is not None
        and len(value) == batch_size
        and all(isinstance(v, (torch.Tensor, np.ndarray)) for v in value)
        and not all(v.ndim > 0 and v.shape[0] == batch_size for v in value)
    )


def _leaves(value: Any, batch_size: int | None, name: str | None = None) -> list[tuple[str, Any]]:
    """(column name, per-sample sequence) of each column in ``value``; ``name``: where it sits in the output."""
    if _is_array(value) or _is_values(value) or _is_per_sample_arrays(value, batch_size):
        return [(name or "prediction", value)]
    if isinstance(value, Mapping) and value:
        return [
            c for key, sub in value.items() for c in _leaves(sub, batch_size, f"{name}.{key}" if name else str(key))
        ]
    if isinstance(value, (list, tuple)) and value:
        return [c for i, sub in enumerate(value) for c in _leaves(sub, batch_size, f"{name or 'prediction'}_{i}")]
    what = "one value for the whole batch" if _is_plain(value) else f"{describe(value)}, nothing per sample"
    where = f"column {name!r}" if name else "it"
    raise Unsplittable(f"{where} is {what}")


def _length(column: Any) -> int:
    return column.shape[0] if _is_array(column) else len(column)


def _cells(column: Any) -> list[Any]:
    """One cell per sample: a number or string as it is, anything larger as a JSON list."""
    if _is_array(column):
        array = column.detach().cpu() if isinstance(column, torch.Tensor) else np.asarray(column)
        if array.ndim == 1 or int(np.prod(array.shape[1:])) == 1:
            return array.reshape(array.shape[0]).tolist()
        # default=str: an object array's odd elements still become text, not a crash at the end of predict
        return [json.dumps(row, default=str) for row in array.tolist()]
    return [_cell(v) for v in column]


def _cell(value: Any) -> Any:
    """One sample's cell: a plain value as it is, a tensor/array as its number or its JSON list."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.item() if value.ndim == 0 else json.dumps(value.tolist(), default=str)
    return value


def prediction_table(output: Any, batch_size: int | None) -> tuple[list[str], list[list[Any]]]:
    """The column names and one row of cells per sample for one batch's ``output`` (without ``index``).

    Args:
        output: What ``predict_step`` returned for the batch.
        batch_size: The samples in the batch; ``None`` when unknown: then every column must have the same length.

    Raises:
        Unsplittable: ``output`` is not one value per sample (see :mod:`project.extras.predictions.writer`).
    """
    leaves = _leaves(output, batch_size)
    names = [name for name, _ in leaves]
    doubled = sorted({name for name in names if names.count(name) > 1 or name in ("index", "dataloader")})
    if doubled:
        raise Unsplittable(f"the columns {doubled} would appear twice in predictions.csv; rename them")
    lengths = {name: _length(column) for name, column in leaves}
    expected = batch_size if batch_size is not None else next(iter(lengths.values()))
    wrong = {name: n for name, n in lengths.items() if n != expected}
    if len(wrong) > 2:  # e.g. a list per sample read as one column per position: name a few, count the rest
        first = ", ".join(repr(name) for name in list(wrong)[:2])
        raise Unsplittable(f"{len(wrong)} columns ({first}, ...) do not have one value each for a batch of {expected}")
    if wrong:
        have = ", ".join(f"column {name!r} has {n}" for name, n in wrong.items())
        raise Unsplittable(f"{have} values for a batch of {expected} samples")
    columns = [_cells(column) for _, column in leaves]
    return names, [list(row) for row in zip(*columns, strict=True)]


def prediction_csv(
    names: Sequence[str], loaders: Mapping[int, Sequence[tuple[int | None, Sequence[Any]]]], several: bool = False
) -> str:
    """The CSV text, header included: ``index,<names>`` rows, or ``dataloader,index,<names>`` for several loaders.

    Args:
        names: The prediction's column names.
        loaders: Predict loader number -> its (sample index, cells) rows in the order predicted; an index is
            ``None`` where the loader does not say it (an IterableDataset).
        several: The run had several predict loaders: say which loader each row is from.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["dataloader", "index", *names] if several else ["index", *names])
    for k in sorted(loaders):
        rows = loaders[k]
        if all(i is not None for i, _ in rows):  # the samplers' own indices: dataset order, whatever the sampler
            numbered = sorted(rows, key=lambda row: row[0])
        else:  # a stream: its order is the only one there is
            numbered = [(i, cells) for i, (_, cells) in enumerate(rows)]
        writer.writerows(([k] if several else []) + [i, *cells] for i, cells in numbered)
    return out.getvalue()
