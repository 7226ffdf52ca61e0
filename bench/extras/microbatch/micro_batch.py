"""Steps/s with ``parallel.micro_batch: auto`` against every fixed micro-batch of the same global batch.

    python -m bench.extras.microbatch.micro_batch                # prints a table; --out FILE writes it too
    python -m bench.extras.microbatch.micro_batch --processes 2  # the same on 2 CPU processes

Each row is one ``python -m project fit`` of the digits classifier (a wider network, no BatchNorm or dropout: the
result does not depend on the micro-batch) with the global batch fixed: the fixed sizes are the ones ``auto`` would
try, and ``auto`` picks one of them at the start of ``fit``. Throughput comes from the bench's step timer (the
median of its windows, warm-up excluded), which ticks per loader batch: a micro-batch (divided by the accumulation
it is optimizer steps/s), or under ``auto`` a whole step, which the template splits itself. The search's cost shows
in the wall time of the ``auto`` row. The weights checksum of each row (the sum
of every parameter) shows that the runs trained alike, to float noise: the order of summation differs with the
micro-batch, and 40 steps of AdamW carry it to the third decimal of a sum of a million weights.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.commands import REPO, environment
from project.extras.microbatch.plan import micro_batch_candidates

NETWORK = [
    "--model.init_args.net.init_args.hidden", "1024",
    "--model.init_args.net.init_args.dropout", "0",
    "--model.init_args.net.init_args.batch_norm", "false",
]  # fmt: skip


def fit(micro: str, processes: int, global_batch: int, steps: int, folder: Path) -> dict:
    """One run's record (steps/s, first-step time, loss), its wall time, and the micro-batch it used."""
    cwd = folder / f"micro-{micro}"
    cwd.mkdir()
    record = cwd / "record.json"
    layout = ["--config", str(REPO / "configs/parallel/cpu_ddp.yaml"), "--parallel.devices", str(processes)]
    command = [
        *(sys.executable, "-m", "project", "fit", "--config", str(REPO / "configs/digits.yaml")),
        *(layout if processes > 1 else []),
        *NETWORK,
        *("--parallel.global_batch_size", str(global_batch), "--parallel.micro_batch", micro),
        *("--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0"),
        *("--trainer.enable_progress_bar", "false", "--test_after_fit", "false"),
        "--trainer.callbacks+=bench.timing.StepTimer",
    ]
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=cwd, env=environment(None, record, warmup=10), capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench.extras.microbatch.micro_batch: micro_batch={micro} failed:\n{done.stderr[-2000:]}")
    (plan_file,) = cwd.glob("logs/**/plan.json")
    plan = json.loads(plan_file.read_text())
    # The timer ticks per loader batch: a micro-batch, except under auto, whose loader hands whole steps.
    ticks = 1 if plan.get("micro_batch_trials") else plan["accumulation"]
    record = json.loads(record.read_text())
    return {**record, "wall": wall, "micro": plan["micro_batch"], "acc": plan["accumulation"], "ticks": ticks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.extras.microbatch.micro_batch", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    per_process = args.global_batch // args.processes
    sizes = [*map(str, micro_batch_candidates(per_process)[:5]), "auto"]
    lines = [
        f"| micro-batch ({args.processes} process(es), global batch {args.global_batch}) | accumulation "
        "| optimizer steps/s | wall (s) | weights checksum |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as folder:
        for micro in sizes:
            row = fit(micro, args.processes, args.global_batch, args.steps, Path(folder))
            name = f"auto (picked {row['micro']})" if micro == "auto" else micro
            lines.append(
                f"| {name} | {row['acc']} | {row['steps_per_s'] / row['ticks']:.1f} | {row['wall']:.1f} "
                f"| {row['checksum']:.6f} |"
            )
            print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out is not None:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
