"""The GPT layer's rows of ``python -m bench``: ``--chargpt`` (every way, tokens/s) and ``--pipeline`` (2 stages).

``--chargpt`` runs the character-level GPT of ``configs/gpt/chargpt.yaml`` (AdamW at its rate) every way on 1
process and raw and the template on 2; the table adds tokens/s. ``--pipeline`` cuts the same GPT into 2 stages on
2 processes, the template beside the raw pipelining loop (``raw_pipeline.py`` here) per schedule. A full run's
results go to ``results/`` beside this file.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bench.extras.gpt import task
from bench.pipeline import Pipeline
from bench.workloads import Row, Workload, ablated

RESULTS = Path(__file__).resolve().parent / "results"
SCHEDULES = ("1f1b", "gpipe")

CHARGPT = Workload(
    "chargpt", "char GPT 4x128 (0.83 M), 32 x 128 tokens", hidden=128, batch_size=32, steps=150, warmup=25,
    lr=1e-3, task=task.TASK, block_size=128, optimizer="adamw",
)  # fmt: skip
QUICK_CHARGPT = replace(CHARGPT, title="char GPT 4x32, 8 x 32 tokens", hidden=32, batch_size=8, block_size=32, steps=30)
# Four processes share two cores: fewer steps for the 2-D (FSDP x TP) row, the same model and batch per process.
CHARGPT_4 = replace(CHARGPT, steps=60, warmup=10, max_processes=4)
#: configs/gpt/chargpt.yaml's GPT and batch: a step takes about as long as one process's (two stages, two cores),
#: so fewer steps than the DDP rows, still two 50-step windows after the warm-up.
PIPELINE_CHARGPT = replace(CHARGPT, steps=120, warmup=20)
#: ``python -m bench.gpu_check --workload chargpt``: the GPU's workload and the CPU dry run's.
GPU_CHECK = {
    "chargpt": (replace(CHARGPT, name="gpu-chargpt", steps=300, warmup=50), replace(QUICK_CHARGPT, steps=12, warmup=2)),
}


def schedules_of(text: str) -> tuple[str, ...]:
    """``--pipeline``'s value, e.g. ``1f1b,gpipe``, as schedule names.

    Raises:
        argparse.ArgumentTypeError: a name that is not one of :data:`SCHEDULES` (argparse prints it in one line).
    """
    names = tuple(name.strip().lower() for name in text.split(","))
    unknown = sorted(set(names) - set(SCHEDULES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown pipeline schedule(s) {unknown}; choose from {','.join(SCHEDULES)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--chargpt`` and ``--pipeline [SCHEDULES]``."""
    parser.add_argument(
        "--chargpt", action="store_true", help="only the character-level GPT's rows (results/chargpt/); with tokens/s"
    )
    parser.add_argument(
        "--pipeline",
        nargs="?",
        type=schedules_of,
        const=SCHEDULES,
        default=None,
        help="only the GPT at 2 pipeline stages, raw pipelining loop and template, with these schedules "
        "(default 1f1b,gpipe; results/pipeline/)",
    )


def chosen(args: argparse.Namespace) -> Path | None:
    """Where a full run's results go when ``--pipeline`` or ``--chargpt`` is given; ``None`` otherwise."""
    if args.pipeline:
        return RESULTS / "pipeline"
    return RESULTS / "chargpt" if args.chargpt else None


def rows(args: argparse.Namespace, quick: bool, gpu: bool) -> list[Row]:
    """The pipeline rows (``--pipeline``), else the GPT's rows (``--chargpt``; ``--ablate`` adds its variants)."""
    if args.pipeline:
        return pipeline_rows(quick, args.pipeline)
    found = gpt_rows(quick, gpu)
    return ablated(found) if args.ablate else found


def gpt_rows(quick: bool, gpu: bool) -> list[Row]:
    """1 process every way, 2 processes raw and template; the template with tensor parallel 2 on 2 processes and
    FSDP 2 x TP 2 on 4 (a full run); the GPU row when there is one.
    """
    workload = QUICK_CHARGPT if quick else CHARGPT
    found = [Row(workload, 1, variants=("raw", "plain", "template") if quick else Row.variants)]
    found.append(Row(workload, 2, variants=("raw", "template")))
    if not quick:  # tensor parallelism has no raw loop here: the template's tokens/s beside the rows above
        found.append(Row(workload, 2, variants=("template",), tensor_parallel=2))
        found.append(Row(CHARGPT_4, 4, variants=("template",), tensor_parallel=2, fsdp=True))
    return found + ([Row(workload, 1, "gpu")] if gpu and not quick else [])


def pipeline_rows(quick: bool, schedules: tuple[str, ...] = SCHEDULES) -> list[Row]:
    """The GPT at 2 stages on 2 processes (one pipeline, no data parallelism), raw and template, per schedule."""
    workload = QUICK_CHARGPT if quick else PIPELINE_CHARGPT
    return [Row(workload, 2, variants=("raw", "template"), pipeline=Pipeline(2, name)) for name in schedules]
