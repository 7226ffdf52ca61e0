"""``python -m bench.gpu_check`` (``make gpu-check``): one GPU, float32 vs bf16-mixed, compile off vs on, raw beside.

One command for the first GPU machine at hand, sized for under 5 minutes on one GPU (six runs of 600 steps,
most of the time start-up and compilation; not yet measured on a GPU):
the bench's GPU workload (``bench/workloads.py``: MLP 64-1024(BN)-1024-10, batch 256, 600 steps) trained

- by the raw loop (``bench/raw.py --device cuda``), in float32 and under bf16 autocast;
- by the template (``python -m project fit`` with ``configs/parallel/single_gpu.yaml``), with
  ``parallel.precision`` 32 and bf16-mixed, each with ``parallel.compile`` false and true.

Each way runs once (``--repeats N`` for more), in its own folder, and writes the same record as the bench (steps/s
after a warm-up, time to the first step, final loss, weights checksum). The table goes to
``bench/results/gpu_check.md``. The raw loop and the eager template of one precision do the same arithmetic in the
same order, so their final losses must agree (within the bench's GPU tolerance; the command fails otherwise);
compiled kernels round differently, so the compiled rows show their loss beside the eager one without a verdict.

``--workload NAME`` runs a layer's workload the same ways instead (its ``rows.py``'s ``GPU_CHECK``, ``bench/tasks.py``;
``chargpt``: the GPT layer's), into ``bench/results/gpu_check-NAME.md``.

Without a GPU it refuses in one line (exit code 2). ``--cpu-dry-run`` runs the same ways on the CPU with a tiny
workload (bf16 through CPU autocast), to check the script itself; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.commands import REPO, environment, prepare_data, write_template_config
from bench.harness import LOSS_RTOL, RUN_TIMEOUT_S, gpu_available, machine
from bench.tasks import row_sets
from bench.workloads import GPU, Workload

RESULTS = REPO / "bench" / "results"
#: The dry run's workload: the GPU workload's shape, small enough for seconds on a CPU.
DRY = replace(GPU, name="gpu-dry", hidden=64, batch_size=32, steps=12, warmup=2)
#: ``--workload`` -> (the GPU's workload, the dry run's): the MLP, and the layers' (``chargpt``: the GPT layer's).
WORKLOADS = {"mlp": (GPU, DRY)} | {
    name: pair for extra in row_sets() for name, pair in getattr(extra, "GPU_CHECK", {}).items()
}


@dataclass(frozen=True)
class Way:
    """One way to train the workload: the raw loop or the template, at a precision, compiled or not."""

    runner: str  # "raw" or "template"
    precision: str  # "32" or "bf16-mixed"
    compile: bool = False

    @property
    def key(self) -> str:
        """Stable id, e.g. ``template-bf16-mixed-compile``."""
        return f"{self.runner}-{self.precision}" + ("-compile" if self.compile else "")


#: The compile layer's ``layer.py``: the compiled ways run where it is installed (``parallel.compile`` is its).
COMPILE = REPO / "project" / "extras" / "compile" / "layer.py"
WAYS = tuple(
    way
    for way in (
        Way("raw", "32"),
        Way("template", "32"),
        Way("template", "32", compile=True),
        Way("raw", "bf16-mixed"),
        Way("template", "bf16-mixed"),
        Way("template", "bf16-mixed", compile=True),
    )
    if not way.compile or COMPILE.is_file()
)


def command(way: Way, workload: Workload, data: Path, config: Path, gpu: bool) -> list[str]:
    """The command line that trains ``workload`` the ``way`` way (on the GPU, or the CPU for the dry run)."""
    python = sys.executable
    if way.runner == "raw":
        args = [python, str(REPO / "bench/raw.py"), "--data", str(data), "--warmup", str(workload.warmup)]
        args += [*workload.script_args(), "--device", "cuda" if gpu else "cpu"]
        return args + (["--bf16"] if way.precision == "bf16-mixed" else [])
    layout = ["--config", str(REPO / "configs/parallel/single_gpu.yaml")] if gpu else []
    return [
        python, "-m", "project", "fit",
        "--config", str(REPO / workload.base_config),
        *layout,
        "--config", str(config),
        "--parallel.precision", way.precision,
        "--parallel.compile", str(way.compile).lower(),
        "--test_after_fit", "false",
        "--trainer.callbacks+=bench.timing.StepTimer",
    ]  # fmt: skip


def run(args: list[str], run_dir: Path, warmup: int, threads: int) -> dict[str, Any]:
    """Run one command in a fresh ``run_dir``; its record (``error`` set when it failed)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    record_path, log = run_dir / "record.json", run_dir / "output.log"
    start = time.time()
    try:
        with log.open("w") as out:
            code = subprocess.run(
                args,
                cwd=run_dir,
                env=environment(None, record_path, warmup, threads),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=RUN_TIMEOUT_S,
            ).returncode
    except subprocess.TimeoutExpired:
        code = -1
    if code != 0 or not record_path.exists():
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-2:])
        return {"error": f"exit {code}: {tail} (log: {log})"}
    record = json.loads(record_path.read_text())
    record["startup_s"] = record["first_step_wall"] - start
    record["wall_s"] = time.time() - start
    return record


def agree(a: float, b: float, tolerance: float) -> bool:
    """Whether two final losses are equal within the relative ``tolerance``."""
    return abs(a - b) <= tolerance * max(abs(a), abs(b), 1e-12)


def median(records: list[dict[str, Any]], key: str) -> float | None:
    """Median of ``key`` over the successful records."""
    values = [r[key] for r in records if "error" not in r]
    return statistics.median(values) if values else None


def table(results: dict[str, list[dict[str, Any]]], ways: tuple[Way, ...], tolerance: float) -> tuple[list[str], bool]:
    """Markdown rows, and whether the raw loop and the eager template of each precision did the same work."""
    lines = [
        "| way | precision | compile | steps/s | / raw (same precision) | / template eager | first step s "
        "| final loss | same work as raw |",
        "| --- | --- | :-: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    ok = True
    for way in ways:
        records = results[way.key]
        speed, startup, loss = (median(records, key) for key in ("steps_per_s", "startup_s", "final_loss"))
        raw = median(results.get(Way("raw", way.precision).key, []), "steps_per_s")
        eager = median(results.get(Way("template", way.precision).key, []), "steps_per_s")
        raw_loss = median(results.get(Way("raw", way.precision).key, []), "final_loss")
        failed = [r["error"] for r in records if "error" in r]
        if failed:
            ok, check = False, f"**failed**: {failed[0][:200]}"
        elif way.runner == "raw" or raw_loss is None or loss is None:
            check = "—"
        elif agree(loss, raw_loss, tolerance):
            check = "same"
        elif way.compile:
            check = f"differs by {abs(loss - raw_loss) / abs(raw_loss):.2g} (relative; compiled kernels round apart)"
        else:
            ok, check = False, f"**NO**: {loss:.6g} vs raw {raw_loss:.6g}"
        lines.append(
            f"| {way.runner} | {way.precision} | {'yes' if way.compile else 'no'} | {_num(speed)} "
            f"| {_ratio(speed, raw)} | {_ratio(speed, eager)} | {_num(startup, 2)} | {_num(loss, 6, 'g')} | {check} |"
        )
    return lines, ok


def _num(value: float | None, digits: int = 0, kind: str = "f") -> str:
    return "—" if value is None else f"{value:,.{digits}{kind}}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def main(argv: list[str] | None = None) -> int:
    """Run every way, write the table; 2 without a GPU (unless ``--cpu-dry-run``), 1 when a way failed."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cpu-dry-run", action="store_true", help="the same ways, tiny, on the CPU (checks the script)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each way, interleaved (default 1)")
    parser.add_argument(
        "--workload", choices=tuple(WORKLOADS), default="mlp", help="the MLP (default) or a layer's workload"
    )
    parser.add_argument("--ways", default=None, help=f"comma-separated subset of: {', '.join(w.key for w in WAYS)}")
    parser.add_argument("--threads", type=int, default=1, help="intra-op CPU threads per process (0: torch's default)")
    parser.add_argument("--out", type=Path, default=None, help="where gpu_check.md goes (default bench/results)")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory: data, runs, gpu_check.json")
    args = parser.parse_args(argv)
    has_gpu, gpu_note = gpu_available()
    if not has_gpu and not args.cpu_dry_run:
        print(
            f"error: {gpu_note}; run this on a machine with a GPU, or --cpu-dry-run to check the script",
            file=sys.stderr,
        )
        return 2
    gpu = has_gpu and not args.cpu_dry_run
    known = {way.key: way for way in WAYS}
    wanted = [key.strip() for key in args.ways.split(",")] if args.ways else list(known)
    unknown = [key for key in wanted if key not in known]
    if unknown:
        print(f"error: --ways {','.join(unknown)} unknown; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    ways = tuple(known[key] for key in wanted)
    workload = WORKLOADS[args.workload][0 if gpu else 1]
    mode = ("gpu" if gpu else "cpu-dry-run") + ("" if args.workload == "mlp" else f"-{args.workload}")
    out = (args.out or (RESULTS if gpu else RESULTS / "tmp" / mode)).resolve()
    work = (args.work or RESULTS / "tmp" / f"gpu-check-{mode}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    inputs = prepare_data(workload, work), write_template_config(workload, work)
    print(f"gpu check ({mode}): {gpu_note}; {len(ways)} ways x {args.repeats}", flush=True)
    results: dict[str, list[dict[str, Any]]] = {way.key: [] for way in ways}
    started = time.time()
    for repeat in range(args.repeats):
        for way in ways:
            record = run(
                command(way, workload, *inputs, gpu), work / f"{way.key}-{repeat}", workload.warmup, args.threads
            )
            results[way.key].append(record)
            said = record.get("error") or f"{record['steps_per_s']:.1f} steps/s, loss {record['final_loss']:.6g}"
            print(f"  [{repeat + 1}/{args.repeats}] {way.key:<28} {said}", flush=True)
    rows, ok = table(results, ways, LOSS_RTOL["gpu" if gpu else "cpu"])
    info = machine()
    text = "\n".join(
        [
            "# GPU check" + ("" if gpu else " (CPU dry run: checks the script, timings mean nothing)"),
            "",
            f"- Machine: {info['gpu'] or 'no GPU'}; {info['cpu']}, {info['cores']} cores; {info['platform']}",
            f"- Software: Python {info['python']}, torch {info['torch']}, lightning {info['lightning']}",
            f"- Workload: {workload.title}, {workload.steps} steps (warm-up {workload.warmup}), {workload.optimizer}; "
            f"{args.repeats} run(s) per way, {(time.time() - started) / 60:.1f} min in all",
            "- Steps/s after the warm-up (compilation happens in the first steps, so it counts in the first-step "
            f"time); the template's ways use `{workload.base_config}` with its checkpoints and callbacks",
            "",
            *rows,
            "",
        ]
    )
    name = "gpu_check.md" if args.workload == "mlp" else f"gpu_check-{args.workload}.md"
    (out / name).write_text(text)
    (work / "gpu_check.json").write_text(json.dumps({"machine": info, "results": results}, indent=1) + "\n")
    print(f"\n{text}\nwrote {out / name}")
    if not ok:
        print("error: a way failed, or the raw loop and the eager template did not do the same work", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
