"""Tokens per second of the language-model rows, every way side by side: steps/s x batch x block x dp processes."""

from __future__ import annotations

from bench.commands import LABELS, VARIANTS
from bench.harness import RowResult


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def tokens_table(rows: list[RowResult]) -> list[str]:
    """A ``## Tokens per second`` section for the rows whose samples are token windows (none: nothing)."""
    language = [result for result in rows if result.row.workload.block_size]
    if not language:
        return []
    lines = [
        "## Tokens per second",
        "",
        "Every process's tokens together: steps/s (the throughput table's medians) x batch per process x "
        "block x data-parallel processes (the processes of a tensor-parallel group share their batch).",
        "",
        "| workload, layout | " + " | ".join(LABELS[v] for v in VARIANTS) + " | template / raw |",
        "| --- |" + " ---: |" * (len(VARIANTS) + 1),
    ]
    for result in language:
        workload = result.row.workload
        per_step = workload.batch_size * workload.block_size * result.row.data_parallel
        rates = {v: result.median(v, "steps_per_s") for v in VARIANTS}
        tokens = {v: None if rate is None else rate * per_step for v, rate in rates.items()}
        ratio = result.ratio("template", "raw")
        cells = " | ".join(_num(tokens[v]) for v in VARIANTS)
        lines.append(f"| {result.row.title} | {cells} | {'—' if ratio is None else f'{ratio:.2f}x'} |")
    return [*lines, ""]
