"""The results as a markdown table (``results.md``), a plot (``results.png``) and JSON (``results.json``)."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.commands import LABELS, PER_STEP_CALLBACKS, VARIANTS
from bench.harness import LatencyResult, RowResult, Run
from bench.pipeline import Pipeline, pipeline_table
from bench.record import WINDOW_STEPS
from bench.tokens import tokens_table
from bench.workloads import STARTUP_SLACK_S, TARGETS, Row, Workload


def _num(value: float | None, digits: int = 0) -> str:
    if value is not None and digits == 0 and abs(value) < 10:
        digits = 2  # a few steps/s (the GPT): whole numbers would hide the differences
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _met(ok: bool | None) -> str:
    return "—" if ok is None else ("yes" if ok else "**no**")


def _paired(result: RowResult, variant: str, other: str, spread: bool = False) -> str:
    """``variant`` / ``other``: the median of the repeats' ratios, and with ``spread`` their range."""
    ratio, pairs = result.ratio(variant, other), result.ratios(variant, other)
    if ratio is None:
        return "—"
    return f"{ratio:.2f}x ({min(pairs):.2f}-{max(pairs):.2f})" if spread and len(pairs) > 1 else f"{ratio:.2f}x"


def targets_met(result: RowResult) -> tuple[str, bool | None]:
    """The row's targets as text (template / way >= ratio) and whether all were met (None: none, or unknown)."""
    targets = TARGETS.get(result.row.key, {})
    if not targets:
        return "—", None
    met: bool | None = True
    for way, ratio in targets.items():
        found = result.ratio("template", way)
        if found is None:
            met = None
            break
        met = met and found >= ratio
    return ", ".join(f"/ {way} >= {ratio:.2f}x" for way, ratio in targets.items()), met


def throughput_table(rows: list[RowResult]) -> list[str]:
    """Steps/s medians, the template's ratios to each way, its targets and the equal-work check."""
    lines = [
        "| workload, layout | raw steps/s | Lightning floor | plain Lightning | template | floor / raw | plain / raw "
        "| template / raw | **template / floor** (range) | **template / plain** (range) | target | met | noise "
        "| equal work: final loss |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | :-: | ---: | --- |",
    ]
    for result in rows:
        raw, floor, plain, tpl = (result.median(v, "steps_per_s") for v in VARIANTS)
        target_text, met = targets_met(result)
        spreads = [s for s in (result.spread(v, "steps_per_s") for v in VARIANTS) if s is not None]
        noise = f"{max(spreads) * 100:.0f}%" if spreads else "—"
        same, detail = result.equal_work()
        check = f"same: {detail}" if same else f"**NO**: {detail[:300]}"
        if result.retried:
            check += "; run again after a failure: " + ", ".join(
                f"{run.variant} #{run.repeat + 1} ({run.error or ''}"[:160] + ")" for run in result.retried
            )
        lines.append(
            f"| {result.row.title} | {_num(raw)} | {_num(floor)} | {_num(plain)} | {_num(tpl)} "
            f"| {_paired(result, 'floor', 'raw')} | {_paired(result, 'plain', 'raw')} "
            f"| {_paired(result, 'template', 'raw')} | **{_paired(result, 'template', 'floor', True)}** "
            f"| **{_paired(result, 'template', 'plain', True)}** | {target_text} | {_met(met)} | {noise} | {check} |"
        )
    return lines


def _short(row: Row) -> str:
    """A plot label: the workload, its processes and its tensor-parallel degree."""
    split = f", tp{row.tensor_parallel}" if row.tensor_parallel > 1 else ""
    split += f", pp{row.pipeline.stages} {row.pipeline.schedule}" if row.pipeline else ""
    return f"{row.workload.name}, {row.processes}p{split}"


def scaling_table(rows: list[RowResult]) -> list[str]:
    """Samples/s at 1, 2 and 4 CPU processes, for each workload that ran at more than one."""
    counts = (1, 2, 4)
    lines = [
        "| workload | way | " + " | ".join(f"{n} process{'es' if n > 1 else ''} samples/s" for n in counts)
        + " | " + " | ".join(f"{n} / 1" for n in counts[1:]) + " |",
        "| --- | --- |" + " ---: |" * (2 * len(counts) - 1),
    ]  # fmt: skip
    by_key = {r.row.key: r for r in rows}
    for result in rows:
        row = result.row
        others = [by_key.get(f"{row.workload.name}-cpu-{n}") for n in counts[1:]]
        if row.device != "cpu" or row.processes != 1 or not any(others):
            continue
        for variant in VARIANTS:
            rates = []
            for n, found in zip(counts, [result, *others]):
                steps = None if found is None else found.median(variant, "steps_per_s")
                rates.append(None if steps is None else steps * row.workload.batch_size * n)
            cells = " | ".join(_num(rate) for rate in rates)
            ratios = " | ".join(_ratio(rate, rates[0]) for rate in rates[1:])
            lines.append(f"| {row.workload.title} | {LABELS[variant]} | {cells} | {ratios} |")
    return lines


def ablation_table(rows: list[RowResult]) -> list[str]:
    """``--ablate``: the template without its per-step callbacks, and every per-step cost timed in a run."""
    if not any(result.of("lean") for result in rows):
        return []
    lines = [
        f"## Ablation: the template without {' and '.join(PER_STEP_CALLBACKS)}",
        "",
        "| workload, layout | template | without them | gain | without / raw | without / plain | without / floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in rows:
        raw, floor, plain, tpl, lean = (
            result.median(v, "steps_per_s") for v in ("raw", "floor", "plain", "template", "lean")
        )
        lines.append(
            f"| {result.row.title} | {_num(tpl)} | {_num(lean)} | {_ratio(lean, tpl)} | {_ratio(lean, raw)} "
            f"| {_ratio(lean, plain)} | {_ratio(lean, floor)} |"
        )
    return [*lines, "", *per_step_costs_table(rows)]


def per_step_costs_table(rows: list[RowResult]) -> list[str]:
    """Microseconds per step of each callback's per-step hooks and of Lightning's call around them (``hooks`` runs)."""
    timed = [r for r in rows if r.of("hooks")]
    if not timed:
        return []

    def median_of(result: RowResult, kind: str, name: str) -> float | None:
        values = [r.record[kind][name] for r in result.of("hooks") if r.record and name in r.record.get(kind, {})]
        return statistics.median(values) if values else None

    names = sorted({name for r in timed for run in r.of("hooks") if run.record for name in run.record["hooks_us"]})
    callbacks = sorted({n for r in timed for run in r.of("hooks") if run.record for n in run.record["dispatch_us"]})
    head = "| us per step (median of the `hooks` runs) | " + " | ".join(r.row.title for r in timed) + " |"
    lines = [
        "### Every per-step cost of the template, timed in the run",
        "",
        "Inside each callback's per-step hooks (and the module's `on_train_batch_end`, where it logs), then what",
        "Lightning spends calling each callback's six per-step hooks even when they do nothing (`getattr`, the",
        "callback's `state_key`, the profiler's context; only the `getattr` for the hooks the template sets to",
        "`None` because the callback leaves them empty), timed in the same process after training.",
        "",
        head,
        "| --- |" + " ---: |" * len(timed),
    ]
    totals = [0.0] * len(timed)
    for kind, listed, label in (("hooks_us", names, "in {}"), ("dispatch_us", callbacks, "calling {}")):
        for name in listed:
            cells = []
            for i, result in enumerate(timed):
                value = median_of(result, kind, name)
                totals[i] += value or 0.0
                cells.append(_num(value, 1))
            lines.append(f"| {label.format(name)} | " + " | ".join(cells) + " |")
    steps = [1e6 / v if (v := r.median("template", "steps_per_s")) else None for r in timed]
    lines.append("| **all of the above** | " + " | ".join(f"**{t:.0f}**" for t in totals) + " |")
    lines.append("| the template's whole step | " + " | ".join(_num(s) for s in steps) + " |")
    return [*lines, ""]


def startup_table(rows: list[RowResult], latency: list[LatencyResult]) -> list[str]:
    """Seconds from the command to the first optimizer step, and of commands that only start and exit."""
    shown = ("raw", "plain", "template")
    lines = [
        "| seconds (median) | raw | plain Lightning | template | template - raw | template / raw | target | met |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | :-: |",
    ]
    for result in rows:
        raw, plain, tpl = (result.median(v, "startup_s") for v in shown)
        diff = None if raw is None or tpl is None else tpl - raw
        met = None if diff is None else diff <= STARTUP_SLACK_S
        lines.append(
            f"| command to first step: {result.row.title} | {_num(raw, 2)} | {_num(plain, 2)} | {_num(tpl, 2)} "
            f"| {_num(diff, 2)} | {_ratio(tpl, raw)} | <= raw + {STARTUP_SLACK_S:g} s | {_met(met)} |"
        )
    for item in latency:
        raw, plain, tpl = (item.median(v) for v in shown)
        diff = None if raw is None or tpl is None else tpl - raw
        what = {
            "plan": "`plan --config configs/digits.yaml`",
            "refusal": "`fit ... --parallel.scenario warp` (a one-line refusal)",
            "import lightning": '`python -c "import lightning"`',
        }.get(item.name, f"`{item.name}`")
        lines.append(
            f"| {what} | {_num(raw, 2)} | {_num(plain, 2)} | {_num(tpl, 2)} | {_num(diff, 2)} "
            f"| {_ratio(tpl, raw)} | — | — |"
        )
    return [*lines, "", *startup_targets(rows, latency)]


#: Start-up targets: several processes start as fast as one; one as fast as plain Lightning; commands that do not
#: train cost at most Lightning's own import.
STARTUP_TARGETS_S = {"processes": 1.5, "plain": 1.5, "import": 1.0}


def startup_targets(rows: list[RowResult], latency: list[LatencyResult]) -> list[str]:
    """The start-up targets, each as a difference of medians from this run (``-`` where a side is missing)."""
    one = next((r for r in rows if r.row.processes == 1 and r.row.device == "cpu"), None)
    tpl_one = one.median("template", "startup_s") if one else None
    lines = ["| start-up target | seconds | target | met |", "| --- | ---: | --- | :-: |"]

    def line(what: str, value: float | None, limit: float) -> None:
        met = None if value is None else value <= limit
        lines.append(f"| {what} | {_num(value, 2)} | <= {limit:g} s | {_met(met)} |")

    for result in rows:
        tpl = result.median("template", "startup_s")
        if result.row.processes > 1 and result.row.tensor_parallel == 1 and tpl is not None and tpl_one is not None:
            line(
                f"template, {result.row.processes} processes - 1 process", tpl - tpl_one, STARTUP_TARGETS_S["processes"]
            )
    plain_one = one.median("plain", "startup_s") if one else None
    if tpl_one is not None and plain_one is not None:
        line("template - plain Lightning, 1 process", tpl_one - plain_one, STARTUP_TARGETS_S["plain"])
    by_name = {item.name: item for item in latency}
    base = by_name["import lightning"].median("plain") if "import lightning" in by_name else None
    for name in ("plan", "fit --help", "refusal"):
        tpl = by_name[name].median("template") if name in by_name else None
        if tpl is not None and base is not None:
            line(f"`{name}` - `import lightning`", tpl - base, STARTUP_TARGETS_S["import"])
    return [*lines, ""]


def markdown(results: dict[str, Any], machine: dict[str, Any], gpu_note: str, quick: bool) -> str:
    """The whole ``results.md``."""
    rows: list[RowResult] = results["rows"]
    load_a, load_b = results["load_before"], results["load_after"]
    cores = machine["cores"]
    head = [
        "# Benchmark results" + (" (quick mode: code-path check, timings mean nothing)" if quick else ""),
        "",
        f"- Machine: {machine['cpu']}, {cores} cores, {machine['gpu'] or 'no GPU'}; {machine['platform']}",
        f"- Software: Python {machine['python']}, torch {machine['torch']}, lightning {machine['lightning']}; "
        f"intra-op threads per process: {results['threads'] or 'torch default'} for every way "
        f"(`--threads`; torch's default here: {machine['torch_threads']})",
        f"- Run: `{' '.join(['python -m bench', *results['argv'][1:]])}`, {results['date']}, "
        f"{results['repeats']} interleaved repeats, {results['elapsed_s'] / 60:.1f} min",
        f"- Load average (1/5/15 min) before: {load_a[0]:.2f}/{load_a[1]:.2f}/{load_a[2]:.2f}, "
        f"after: {load_b[0]:.2f}/{load_b[1]:.2f}/{load_b[2]:.2f} on {cores} cores "
        "(above the core count means other work shared the machine and slowed every way alike)",
        "- Steps/s: median over repeats of each run's steps/s, which is the median over its windows of "
        f"{WINDOW_STEPS} steps after the warm-up steps ({WINDOW_STEPS} is a multiple of the period of every "
        "per-step cost the template has by default, so each window pays its share). Ratios between ways: the "
        "median over the repeats of each repeat's ratio (the ways of a repeat run one after the other, so a slow "
        "spell of a shared machine divides out), with their range for the template's. Noise: (max - min) / "
        "median of steps/s over the repeats, worst of the ways. A run that failed is run once more, and the "
        "equal-work column says so.",
        "- Ways: *raw* is `bench/raw.py` (the seed's loop; torchrun for DDP); *Lightning floor* is `bench/plain.py "
        "--bare` (`Trainer(barebones=True)` without `self.log`: Lightning's loop alone; nothing on "
        "`Trainer.fit` can be faster); *plain Lightning* is `bench/plain.py`, Trainer defaults and one `self.log` "
        "per step; *template* is `python -m project fit --config configs/digits.yaml` (a layer's task: its "
        "own base config, e.g. the regression's; + `configs/parallel/cpu_ddp.yaml` for several "
        "processes) with the workload's model, data, optimizer and steps layered on top.",
        "",
        "## Throughput",
        "",
        *throughput_table(rows),
        "",
        f"GPU row: {gpu_note}",
        "",
        *tokens_table(rows),
        *pipeline_table(rows),
        *ablation_table(rows),
        "## Scaling on CPU",
        "",
        *scaling_table(rows),
        "",
        "## Start-up",
        "",
        *startup_table(rows, results["latency"]),
        "",
    ]
    return "\n".join(head)


def plot(results: dict[str, Any], path: Path) -> None:
    """Throughput relative to raw per row (with targets), and start-up seconds per way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[RowResult] = results["rows"]
    colors = {"raw": "#888888", "floor": "#7570b3", "plain": "#d95f02", "template": "#1b9e77"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    width = 0.2
    for k, variant in enumerate(VARIANTS):
        values = []
        for result in rows:  # the table's ratios: each repeat's, their median
            values.append(result.ratio(variant, "raw") or 0.0)
        xs = [i + (k - 1.5) * width for i in range(len(rows))]
        left.bar(xs, values, width, label=LABELS[variant], color=colors[variant])
    for i, result in enumerate(rows):
        floor = result.ratio("floor", "raw")
        target = TARGETS.get(result.row.key, {}).get("floor")
        if target and floor:
            left.hlines(target * floor, i - 2 * width, i + 2 * width, colors="black", linestyles="dashed")
    # Short labels (the titles overlap); the table names each row in full.
    left.set_xticks(range(len(rows)), [_short(r.row) for r in rows], fontsize=8)
    left.set_ylabel("steps/s relative to raw PyTorch (dashed: 0.95 x floor)")
    left.set_title("Throughput (higher is better)")
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(VARIANTS))

    shown = ("raw", "plain", "template")
    labels, series = [], {v: [] for v in shown}
    for result in rows:
        labels.append(f"first step\n{_short(result.row)}")
        for variant in shown:
            series[variant].append(result.median(variant, "startup_s") or 0.0)
    for item in results["latency"]:
        labels.append(item.name)
        for variant in shown:
            series[variant].append(item.median(variant) or 0.0)
    for k, variant in enumerate(shown):
        xs = [i + (k - 1) * width for i in range(len(labels))]
        right.bar(xs, series[variant], width, label=LABELS[variant], color=colors[variant])
    right.set_xticks(range(len(labels)), labels, fontsize=7)
    right.set_ylabel("seconds")
    right.set_title("Start-up (lower is better)")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(shown))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: What ``run_all`` says about the run as a whole.
RUN_KEYS = ("elapsed_s", "date", "load_before", "load_after", "repeats", "threads", "argv")


def to_json(results: dict[str, Any], machine: dict[str, Any], gpu_note: str) -> str:
    """Every run, for re-analysis (and the test's equal-work assertions)."""
    rows = []
    for result in results["rows"]:
        same, detail = result.equal_work()
        rows.append(
            {
                "key": result.row.key,
                "title": result.row.title,
                "workload": asdict(result.row.workload),
                "processes": result.row.processes,
                "device": result.row.device,
                "variants": list(result.row.variants),
                "tensor_parallel": result.row.tensor_parallel,
                "fsdp": result.row.fsdp,
                "pipeline": asdict(result.row.pipeline) if result.row.pipeline else None,
                "equal_work": same,
                "equal_work_detail": detail,
                "runs": [asdict(run) for run in result.runs],
                "retried": [asdict(run) for run in result.retried],
            }
        )
    latency = [{"name": item.name, "walls": item.walls} for item in results["latency"]]
    data = {key: results[key] for key in RUN_KEYS}
    return json.dumps({**data, "machine": machine, "gpu": gpu_note, "rows": rows, "latency": latency}, indent=1)


def from_json(text: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``to_json``'s output back as (results, machine, GPU note), to render the table and plot again."""
    data = json.loads(text)
    rows = [
        RowResult(
            Row(
                Workload(**row["workload"]),
                row["processes"],
                row["device"],
                tuple(row["variants"]),
                row.get("tensor_parallel", 1),
                row.get("fsdp", False),
                Pipeline(**row["pipeline"]) if row.get("pipeline") else None,
            ),
            [Run(**run) for run in row["runs"]],
            [Run(**run) for run in row.get("retried", [])],
        )
        for row in data["rows"]
    ]
    latency = [LatencyResult(item["name"], item["walls"]) for item in data["latency"]]
    return {**{key: data[key] for key in RUN_KEYS}, "rows": rows, "latency": latency}, data["machine"], data["gpu"]
