"""Where each way's step time goes: sample the training loop with py-spy and split it into parts.

    pip install py-spy            # not a dependency of the project; only this tool needs it
    python -m bench.profiling       # writes bench/results/profile.txt

Each way trains the small workload in one process (or ``--processes 2``: every rank is sampled)
under ``py-spy record --nonblocking --idle --subprocesses``. A sample counts when it falls inside
the training loop; it is put in the first part whose frame it is under (a callback's hook, the
DataLoader, backward, forward, the optimizer update, ``zero_grad``, logging, a collective), else in
the loop itself. Microseconds per step are the part's share of the samples times the step time
measured in that same run (py-spy slows the run a little; the shares are what to read).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.commands import LABELS, REPO, VARIANTS, command, environment, prepare_data, write_template_config
from bench.workloads import SMALL, Row

# (part, frames that put a sample in it); the first part whose frame is on the stack wins.
PARTS = (
    ("data: DataLoader", ("_BaseDataLoaderIter.__next__",)),
    ("backward (autograd)", ("_engine_run_backward", "Tensor.backward")),
    ("forward (model + loss)", ("Module._call_impl", "cross_entropy (")),
    ("optimizer update", ("sgd (torch/optim/sgd.py", "_single_tensor_sgd", "_multi_tensor_sgd")),
    ("zero_grad", ("Optimizer.zero_grad",)),
    ("logging (self.log, logger)", ("LightningModule.log (", "_LoggerConnector", "TensorBoardLogger")),
    ("collectives outside DDP", ("distributed_c10d.py",)),
    ("bench timer", ("StepClock.tick", "StepTimer.")),
)
LIGHTNING_LOOP = ("_TrainingEpochLoop.advance (", "_TrainingEpochLoop.on_advance_end (")
RAW_LOOP = (
    "_BaseDataLoaderIter.__next__",
    "Module._call_impl",
    "cross_entropy (",
    "Tensor.backward",
    "SGD.step",
    "StepClock.tick",
)
CALLBACKS = "_call_callback_hooks ("


def _frames(line: str) -> tuple[list[str], int]:
    stack, count = line.rsplit(" ", 1)
    return stack.split(";"), int(count)


def part_of(frames: list[str], variant: str) -> str | None:
    """The part a sampled stack belongs to, or ``None`` when it is outside the training loop."""
    if variant == "raw":
        if not any(f.startswith("main (") and "raw.py" in f for f in frames):
            return None
        in_main = frames[-1].startswith("main (")  # the loop's own Python lines
        if not in_main and not any(marker in f for f in frames for marker in RAW_LOOP):
            return None
    elif not any(f.startswith(LIGHTNING_LOOP) for f in frames):
        return None
    for i, frame in enumerate(frames):
        if frame.startswith(CALLBACKS):
            owner, _, hook = frames[i + 1].split(" (", 1)[0].partition(".") if i + 1 < len(frames) else ("", "", "")
            if not hook.startswith("on_"):
                # Around every hook of every callback: the state_key string, the profiler context, setattr.
                return "callback dispatch (per callback and hook)"
            # Whatever a hook does (e.g. save a checkpoint) counts against its callback.
            return "bench timer" if owner == "StepTimer" else f"callback: {owner}"
    for name, markers in PARTS:
        if any(marker in frame for frame in frames for marker in markers):
            return name
    return "the loop itself (raw: Python; Lightning: hooks, closures, bookkeeping)"


def summarise(stacks: Path, variant: str) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Samples per part, and inclusive samples per frame, of the loop's stacks."""
    parts: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in stacks.read_text().splitlines():
        # py-spy writes a line per stack; a process name with a newline in its command line splits one
        if not line.strip() or not line.rsplit(" ", 1)[-1].isdigit():
            continue
        frames, count = _frames(line)
        frames = [re.sub(r":\d+\)$", ")", f) for f in frames]
        part = part_of(frames, variant)
        if part is None:
            continue
        parts[part] += count
        for frame in set(frames):
            inclusive[frame] += count
    return parts, inclusive


def py_spy() -> str:
    """The py-spy executable (next to this Python first)."""
    found = Path(sys.executable).with_name("py-spy")
    if found.exists():
        return str(found)
    which = shutil.which("py-spy")
    if which is None:
        raise SystemExit("error: py-spy is not installed; `pip install py-spy` (a profiling tool, not a dependency)")
    return which


def profile(variant: str, row: Row, work: Path, rate: int) -> tuple[dict, Path]:
    """Run one way under py-spy; return its record and the stacks file."""
    data, config = prepare_data(row.workload, work), write_template_config(row.workload, work)
    run_dir = work / f"profile-{variant}-{row.processes}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    stacks, record = run_dir / "stacks.txt", run_dir / "record.json"
    # --idle: time a rank waits in a collective is part of its step; --subprocesses: every rank.
    spy = [py_spy(), "record", "--nonblocking", "--idle", "--subprocesses", "-r", str(rate), "-f", "raw"]
    spy += ["-o", str(stacks), "--"]
    with (run_dir / "output.log").open("w") as out:
        subprocess.run(
            spy + command(variant, row, data, config),
            cwd=run_dir,
            env=environment(row, record, row.workload.warmup),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=900,
        )
    return json.loads(record.read_text()), stacks


def report(results: dict[str, tuple[dict, collections.Counter[str], collections.Counter[str]]], row: Row) -> str:
    """The profile summary as text: microseconds per step and share per part, then the template's top frames."""
    variants = list(results)
    names = sorted({p for _, parts, _ in results.values() for p in parts}, key=lambda p: (p.startswith("the loop"), p))
    width = max(len(n) for n in names) + 2
    lines = [
        f"Profile of the training loop: {row.title}, {row.workload.steps} steps (py-spy --nonblocking, "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')})",
        "us/step = share of the loop's samples x the step time measured in the same (sampled) run.",
        "",
        "part".ljust(width) + "".join(f"{LABELS[v]:>22}" for v in variants),
    ]
    # The samples cover the whole loop, so their shares convert to time with the whole run's rate (not the
    # median of its windows, which the throughput table uses).
    rate = {v: results[v][0].get("run_steps_per_s", results[v][0]["steps_per_s"]) for v in variants}
    for name in names:
        cells = []
        for v in variants:
            _, parts, _ = results[v]
            total = sum(parts.values())
            share = parts.get(name, 0) / total if total else 0.0
            cells.append(f"{share * 1e6 / rate[v]:9.0f} us ({share * 100:4.1f}%)")
        lines.append(name.ljust(width) + "".join(f"{c:>22}" for c in cells))
    lines.append("step time".ljust(width) + "".join(f"{1e6 / rate[v]:9.0f} us {'':>8}" for v in variants))
    lines.append("steps/s (under py-spy)".ljust(width) + "".join(f"{rate[v]:>17.0f}     " for v in variants))
    for v in ("template", "plain"):
        if v not in results:
            continue
        _, parts, inclusive = results[v]
        total = sum(parts.values())
        lines += ["", f"{LABELS[v]}: frames by inclusive share of the loop (top 45)"]
        for frame, count in inclusive.most_common(45):
            lines.append(f"  {count / total * 100:5.1f}%  {frame[:140]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profiling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "profile.txt")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "results" / "tmp" / "profile")
    args = parser.parse_args(argv)
    workload = replace(SMALL, name="profile", steps=args.steps, warmup=min(200, args.steps // 10))
    row = Row(workload, args.processes)
    results = {}
    for variant in args.variants.split(","):
        print(f"profiling {variant} ...", flush=True)
        record, stacks = profile(variant, row, args.work, args.rate)
        parts, inclusive = summarise(stacks, variant)
        results[variant] = (record, parts, inclusive)
    text = report(results, row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
