"""What ``check`` found: one record, printed as rich tables and written as ``check.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from project.checkpoints.atomic import atomic_write_text
from project.extras.check.probes import Bandwidth, Place


@dataclass
class CheckReport:
    """Everything ``check`` measured and every failure, each naming the rank, host and device."""

    world_size: int
    backend: str | None
    places: list[Place] = field(default_factory=list)
    values_ok: bool | None = None
    all_reduce: tuple[float, float] | None = None  # (got, expected)
    barrier_wait_s: list[float] = field(default_factory=list)
    bandwidth: list[Bandwidth] = field(default_factory=list)
    weight_difference: list[float] = field(default_factory=list)
    #: What the invariance probe ran: DDP, or the tensor-parallel layout (TP).
    parallel_weights: str = "DDP"
    sampling_ok: bool | None = None
    step_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No failure."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of ``check.json``."""
        data = asdict(self)
        data["ok"] = self.ok
        data["ranks"] = [
            {**asdict(place), "step_s": _at(self.step_s, place.rank), "compute_s": _at(self.compute_s, place.rank)}
            for place in self.places
        ]
        for key in ("places", "step_s", "compute_s"):
            data.pop(key)
        return data

    def write(self, path: str | Path) -> None:
        """Write ``check.json`` atomically (a reader never sees half of it)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    def print(self, console: Console | None = None) -> None:
        """The tables: one row per rank, then one per check."""
        console = console or Console(highlight=False)
        ranks = Table(title=f"check: {self.world_size} process(es), backend {self.backend or 'none'}")
        for column in ("rank", "host", "device", "pid", "step (ms)", "own work (ms)"):
            ranks.add_column(column, justify="right" if "ms" in column or column in ("rank", "pid") else "left")
        for place in self.places:
            step, own = _at(self.step_s, place.rank), _at(self.compute_s, place.rank)
            ranks.add_row(str(place.rank), place.host, place.device, str(place.pid), _ms(step), _ms(own))
        console.print(ranks)
        checks = Table(title="collectives and invariance")
        checks.add_column("check")
        checks.add_column("result")
        for name, result in self._rows():
            checks.add_row(name, result)
        console.print(checks)
        if self.failures:
            for failure in self.failures:
                console.print(f"[bold red]FAILED[/] {failure}")
        else:
            console.print("[bold green]check passed[/]")

    def _rows(self) -> list[tuple[str, str]]:
        single = "n/a (1 process)"
        rows = [("every rank joined", f"yes ({len(self.places)} of {self.world_size})")]
        if self.world_size == 1:
            rows.append(("all-gather / all-reduce of known values", single))
        elif self.all_reduce is not None:
            got, expected = self.all_reduce
            verdict = "ok" if self.values_ok else "WRONG"
            rows.append(("all-gather / all-reduce of known values", f"{verdict} (sum {got:g}, expected {expected:g})"))
        if self.world_size == 1:
            return [*rows, ("barrier, bandwidth, DDP weights = 1-process weights", single), *self._sampling()]
        if self.barrier_wait_s:
            rows.append(("barrier", f"ok, waits {min(self.barrier_wait_s):.4f}-{max(self.barrier_wait_s):.4f} s"))
        rows += [
            (
                f"all-reduce {_size(row.bytes)}",
                f"{row.time_us:,.0f} us" + (" (latency)" if row.bytes < 1024 else f", bus {row.busbw_gbps:.2f} GB/s"),
            )
            for row in self.bandwidth
        ]
        if self.weight_difference:
            worst = max(self.weight_difference)
            verdict = "ok" if worst <= 1e-5 else "DIFFERENT"
            rows.append((f"{self.parallel_weights} weights = 1-process weights", f"{verdict} (max |diff| {worst:.1e})"))
        return rows + self._sampling()

    def _sampling(self) -> list[tuple[str, str]]:
        if self.sampling_ok is None:
            return [
                (
                    "ranks draw 1-process global batches",
                    "not checked (not the template's sampler: parallel null, or the loader's own)",
                )
            ]
        return [("ranks draw 1-process global batches", "ok" if self.sampling_ok else "DIFFERENT")]


def _at(values: list[float], index: int) -> float | None:
    return values[index] if index < len(values) else None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"
