"""What a study found: the best trial, a table of every trial, and ``trials.csv`` in the study folder."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

#: Columns of ``trials.csv`` before the parameters (one column per parameter, its full config key).
CSV_COLUMNS = ("number", "state", "value", "seconds")


def short_name(key: str) -> str:
    """A parameter's config key without the ``init_args`` levels: ``optimizer.lr``, ``model.net.hidden``."""
    return key.replace("init_args.", "")


def format_number(value: Any) -> str:
    """A value as the table and the progress lines show it (6 significant digits)."""
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return "" if value is None else str(value)


def describe(params: dict[str, Any]) -> str:
    """``optimizer.lr=0.001 model.net.hidden=128``."""
    return " ".join(f"{short_name(key)}={format_number(value)}" for key, value in params.items())


def seconds(trial: Any) -> float | None:
    """Wall seconds of a finished trial (for a resumed one: from its first start)."""
    if trial.datetime_start is None or trial.datetime_complete is None:
        return None
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def parameter_keys(trials: list[Any]) -> list[str]:
    """Every parameter key of the trials, in the order they first appear."""
    return list(dict.fromkeys(key for trial in trials for key in trial.params))


def print_table(trials: list[Any], metric: str, console: Console) -> None:
    """One row per trial: number, state, objective, seconds, parameters, run directory or error."""
    keys = parameter_keys(trials)
    table = Table(title=f"Trials ({metric})", title_justify="left")
    for column in ("#", "state", metric, "s", *map(short_name, keys), "run directory / error"):
        table.add_column(column, overflow="fold")
    for trial in trials:
        where = trial.user_attrs.get("error") or trial.user_attrs.get("run_dir") or trial.user_attrs.get("trial_dir")
        table.add_row(
            str(trial.number),
            trial.state.name,
            format_number(trial.value),
            format_number(round(seconds(trial), 1) if seconds(trial) is not None else None),
            *(format_number(trial.params.get(key)) for key in keys),
            str(where or ""),
        )
    console.print(table)


def write_csv(trials: list[Any], path: Path) -> None:
    """``trials.csv``: the table's columns, the parameters under their full keys, then run_dir and error."""
    keys = parameter_keys(trials)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow([*CSV_COLUMNS, *keys, "run_dir", "error"])
        for trial in trials:
            took = seconds(trial)
            writer.writerow(
                [
                    trial.number,
                    trial.state.name,
                    "" if trial.value is None else repr(trial.value),
                    "" if took is None else f"{took:.1f}",
                    *("" if trial.params.get(key) is None else trial.params[key] for key in keys),
                    trial.user_attrs.get("run_dir", ""),
                    trial.user_attrs.get("error", ""),
                ]
            )


def print_best(best: Any, metric: str, console: Console) -> None:
    """The best trial: its objective, parameters and run directory."""
    console.print(f"Best trial: {best.number}, {metric} {format_number(best.value)}")
    for key, value in best.params.items():
        console.print(f"  {key}: {format_number(value)}")
    console.print(f"  run directory: {best.user_attrs.get('run_dir', best.user_attrs.get('trial_dir', '?'))}")
