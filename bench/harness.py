"""Run every row every way, interleaved and repeated; collect medians, ratios and the equal-work check."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.commands import (
    REPO,
    command,
    environment,
    latency_commands,
    prepare_data,
    write_lean_config,
    write_template_config,
)
from bench.workloads import Row

#: Relative tolerance of the equal-work check. On the CPU the ways do the same float32 arithmetic in the
#: same order; on a GPU, bf16 autocast and cuBLAS's choice of kernels (the template asks for deterministic
#: ones) may round differently. The GPU row has not run here (no GPU), so its tolerance is a first guess.
LOSS_RTOL = {"cpu": 1e-5, "gpu": 1e-2}
RUN_TIMEOUT_S = 600


@dataclass
class Run:
    """One measured run: what it printed, how long it took, and the record it wrote (None on failure)."""

    variant: str
    repeat: int
    wall_s: float
    record: dict[str, Any] | None
    error: str | None = None


@dataclass
class RowResult:
    """All runs of one row."""

    row: Row
    runs: list[Run] = field(default_factory=list)
    #: Runs that failed once and were run again (the report lists them; a second failure stays in ``runs``).
    retried: list[Run] = field(default_factory=list)

    def of(self, variant: str) -> list[Run]:
        """The successful runs of ``variant``."""
        return [r for r in self.runs if r.variant == variant and r.record is not None]

    def median(self, variant: str, key: str) -> float | None:
        """Median of ``key`` over the successful runs of ``variant``."""
        values = [r.record[key] for r in self.of(variant) if r.record is not None]
        return statistics.median(values) if values else None

    def spread(self, variant: str, key: str) -> float | None:
        """(max - min) / median of ``key``: how noisy the repeats were."""
        values = [r.record[key] for r in self.of(variant) if r.record is not None]
        if len(values) < 2:
            return None
        return (max(values) - min(values)) / statistics.median(values)

    def ratios(self, variant: str, other: str, key: str = "steps_per_s") -> list[float]:
        """``variant`` / ``other`` of each repeat where both ran: the two ran minutes apart at most, under the
        same load, so a slow spell of this shared machine divides out of each pair (it does not out of a ratio
        of two medians taken over different repeats)."""
        mine = {r.repeat: r.record[key] for r in self.of(variant) if r.record is not None}
        theirs = {r.repeat: r.record[key] for r in self.of(other) if r.record is not None}
        return [mine[k] / theirs[k] for k in sorted(mine) if theirs.get(k)]

    def ratio(self, variant: str, other: str, key: str = "steps_per_s") -> float | None:
        """Median over the repeats of ``variant`` / ``other`` (see :meth:`ratios`); None if no repeat has both."""
        pairs = self.ratios(variant, other, key)
        return statistics.median(pairs) if pairs else None

    def equal_work(self) -> tuple[bool, str]:
        """Whether every run ended at the same loss and weights (the comparison is of equal work)."""
        finished = [r for r in self.runs if r.record is not None]
        failed = [r for r in self.runs if r.record is None]
        if failed:
            first = failed[0]
            return False, f"{len(failed)} run(s) failed, first {first.variant} #{first.repeat + 1}: {first.error}"
        if not finished:
            return False, "no run finished"
        ref = finished[0].record
        assert ref is not None
        for run in finished[1:]:
            assert run.record is not None
            for key in ("final_loss", "checksum"):
                a, b = ref[key], run.record[key]
                if abs(a - b) > LOSS_RTOL[self.row.device] * max(abs(a), abs(b), 1e-12):
                    return False, f"{key} differs: {finished[0].variant} {a!r} vs {run.variant} {b!r}"
        return True, f"{ref['final_loss']:.6g}"


@dataclass
class LatencyResult:
    """Wall times of commands that start and exit without training (``--help``, ``plan``)."""

    name: str
    walls: dict[str, list[float]] = field(default_factory=dict)

    def median(self, variant: str) -> float | None:
        """Median wall time of ``variant``."""
        values = self.walls.get(variant)
        return statistics.median(values) if values else None


def _tail(path: Path, lines: int = 2) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return " | ".join(text[-lines:]) or "(no output)"


def run_once(variant: str, row: Row, repeat: int, inputs: tuple[Path, Path], work: Path, threads: int) -> Run:
    """Run one variant of one row in a fresh directory and read its record."""
    data, config = inputs
    run_dir = work / f"{row.key}-{variant}-{repeat}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    record_path = run_dir / "record.json"
    log = run_dir / "output.log"
    start = time.time()
    try:
        with log.open("w") as out:
            proc = subprocess.run(
                command(variant, row, data, config),
                cwd=run_dir,
                env=environment(row, record_path, row.workload.warmup, threads),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=RUN_TIMEOUT_S,
            )
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = -1
    wall = time.time() - start
    if code != 0 or not record_path.exists():
        return Run(variant, repeat, wall, None, f"exit {code}: {_tail(log)} (log: {log})")
    record = json.loads(record_path.read_text())
    record["startup_s"] = record["first_step_wall"] - start
    record["wall_s"] = wall
    record["load_1m"] = os.getloadavg()[0]  # how shared the cores were over the run's last minute
    # Keep the log of a good run only as long as it is needed: the run directory holds checkpoints.
    shutil.rmtree(run_dir, ignore_errors=True)
    return Run(variant, repeat, wall, record)


def time_command(args: list[str], threads: int) -> float:
    """Wall seconds of a command that starts and exits: it must succeed, or refuse in one line (exit code 2)."""
    start = time.time()
    env = environment(None, None, threads=threads)
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    refused = done.returncode == 2 and done.stderr.strip().splitlines()[-1:] != [] and "Traceback" not in done.stderr
    if done.returncode != 0 and not refused:
        raise subprocess.CalledProcessError(done.returncode, args, done.stdout, done.stderr)
    return time.time() - start


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import lightning
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": gpu,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "platform": platform.platform(),
    }


def gpu_available() -> tuple[bool, str]:
    """Whether the GPU row can run, and if not, why."""
    import torch

    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no visible device"
        return False, f"no GPU: torch.cuda.is_available() is False (torch {torch.__version__}, {build})"
    return True, f"1 x {torch.cuda.get_device_name(0)}"


def rotated(items: tuple[str, ...], by: int) -> list[str]:
    """``items`` started at position ``by``: each repeat runs the variants in another order."""
    by %= len(items)
    return list(items[by:] + items[:by])


def run_all(
    rows: list[Row], repeats: int, work: Path, threads: int = 1, quick: bool = False, log: Any = print
) -> dict[str, Any]:
    """Measure every row and the latency commands, ``repeats`` times, interleaved; return everything."""
    work.mkdir(parents=True, exist_ok=True)
    inputs = {}
    for base in sorted({row.workload.base_config for row in rows if "lean" in row.variants}):
        log(f"  --ablate leaves out of {base}: {'; '.join(write_lean_config(work, base)[1]) or 'nothing'}")
    for row in rows:  # rows of one workload share its data and config (e.g. the small MLP at 1 and 2 processes)
        if row.workload not in inputs:
            inputs[row.workload] = (prepare_data(row.workload, work), write_template_config(row.workload, work))
    results = [RowResult(row) for row in rows]
    latency = {name: LatencyResult(name) for name in latency_commands(quick)}
    load_before = os.getloadavg()
    started = time.time()
    for repeat in range(repeats):
        for i, result in enumerate(results):
            for variant in rotated(result.row.variants, repeat + i):
                run = run_once(variant, result.row, repeat, inputs[result.row.workload], work, threads)
                if run.record is None:  # e.g. gloo's rare abort at exit: once more, and the report says so
                    log(f"  [{repeat + 1}/{repeats}] {result.row.key:<14} {variant:<9} failed, once more: {run.error}")
                    result.retried.append(run)
                    run = run_once(variant, result.row, repeat, inputs[result.row.workload], work, threads)
                result.runs.append(run)
                if run.record is None:
                    log(f"  [{repeat + 1}/{repeats}] {result.row.key:<14} {variant:<9} FAILED: {run.error}")
                else:
                    rec = run.record
                    log(
                        f"  [{repeat + 1}/{repeats}] {result.row.key:<14} {variant:<9} "
                        f"{rec['steps_per_s']:8.1f} steps/s  first step {rec['startup_s']:5.2f} s  "
                        f"loss {rec['final_loss']:.6g}"
                    )
        for name, variants in latency_commands(quick).items():
            for variant in rotated(tuple(variants), repeat):
                wall = time_command(variants[variant], threads)
                latency[name].walls.setdefault(variant, []).append(wall)
                log(f"  [{repeat + 1}/{repeats}] {name:<14} {variant:<9} {wall:5.2f} s")
    return {
        "rows": results,
        "latency": list(latency.values()),
        "elapsed_s": time.time() - started,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "repeats": repeats,
        "threads": threads,
        "argv": sys.argv,
    }
