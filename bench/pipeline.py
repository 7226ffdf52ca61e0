"""A row cut into pipeline stages: its layout, and the table that sets the template beside the raw pipelining loop.

The rows come from a layer (``bench/tasks.py``: a ``rows.py`` picks them, its task's ``RAW_PIPELINE`` is the raw
loop). The raw loop is the reference: ``torch.distributed.pipelining``'s ``PipelineStage`` and schedule, written as
its docs show, on the same network, data, optimizer, micro-batches and schedule as the template's
``--parallel.pipeline_parallel.*``. The table's pipeline section gives template / raw per repeat (paired: the two
ways of a repeat run one after the other) with its range; the target is at least 0.95x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: template / raw tokens/s the pipeline rows aim for (the raw loop is the reference).
TARGET = 0.95


@dataclass(frozen=True)
class Pipeline:
    """A row's pipeline: how many stages, which schedule, how many micro-batches a batch is cut into."""

    stages: int = 2
    schedule: str = "1f1b"
    microbatches: int = 4

    @property
    def key(self) -> str:
        """The row key's suffix, e.g. ``-pp2-1f1b``."""
        return f"-pp{self.stages}-{self.schedule}"

    @property
    def title(self) -> str:
        """What the row's title says about the layout."""
        return f"PP {self.stages}, {self.schedule.upper()}, {self.microbatches} micro-batches, gloo"

    def raw_args(self) -> list[str]:
        """The raw pipelining loop's pipeline arguments."""
        return ["--schedule", self.schedule, "--microbatches", str(self.microbatches)]

    def template_args(self) -> list[str]:
        """The template's ``parallel.pipeline_parallel`` options."""
        section = "--parallel.pipeline_parallel"
        return [
            f"{section}.size", str(self.stages),
            f"{section}.schedule", self.schedule,
            f"{section}.microbatches", str(self.microbatches),
        ]  # fmt: skip


def pipeline_table(results: list[Any]) -> list[str]:
    """A ``## Pipeline parallelism`` section: tokens/s of both ways, template / raw per repeat and its range.

    ``results`` are the harness's ``RowResult``s (not imported: the harness reads the workloads, which read this).
    """
    found = [result for result in results if result.row.pipeline is not None]
    if not found:
        return []
    lines = [
        "## Pipeline parallelism",
        "",
        "The raw loop (the task's `raw_pipeline.py`: `PipelineStage` and the same schedule, as torch's docs write "
        "it) is "
        f"the reference. template / raw: the median over the repeats of each repeat's ratio (the two ran one after "
        f"the other), with the range over the repeats; target >= {TARGET:.2f}x. Noise: (max - min) / median of "
        "each way's tokens/s over the repeats. Load: the 1-minute load average at the end of each run, lowest to "
        "highest (above the core count, other work shared the cores).",
        "",
        "| workload, layout | raw tokens/s | template tokens/s | **template / raw** (range) | target | met "
        "| noise raw | noise template | repeats | load |",
        "| --- | ---: | ---: | ---: | --- | :-: | ---: | ---: | ---: | ---: |",
    ]
    for result in found:
        workload = result.row.workload
        per_step = workload.batch_size * workload.block_size * result.row.data_parallel
        rates = [result.median(v, "steps_per_s") for v in ("raw", "template")]
        raw, tpl = ("—" if r is None else f"{r * per_step:,.0f}" for r in rates)
        pairs = result.ratios("template", "raw")
        ratio = result.ratio("template", "raw")
        text = "—" if ratio is None else f"{ratio:.2f}x ({min(pairs):.2f}-{max(pairs):.2f})"
        met = "—" if ratio is None else ("yes" if ratio >= TARGET else "**no**")
        noise = [result.spread(v, "steps_per_s") for v in ("raw", "template")]
        cells = " | ".join("—" if n is None else f"{n * 100:.0f}%" for n in noise)
        loads = [run.record["load_1m"] for run in result.runs if run.record and "load_1m" in run.record]
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "—"
        lines.append(
            f"| {result.row.title} | {raw} | {tpl} | **{text}** | >= {TARGET:.2f}x | {met} | {cells} "
            f"| {len(pairs)} | {load} |"
        )
    return [*lines, ""]
