"""Running the conformance cells and judging them: holds, refused (one line before training) or fails.

A :class:`Lane` runs each (feature, layout) fit once and shares it between the checks of the cell (and the
1-process run between every layout); its verdicts are recorded for docs/conformance.md (``report.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from conformance.matrix import BASE, LAYOUTS, REFERENCE, RESUME_LAYOUT, Feature, callback
from conformance.shapes_data import VAL

from project.checkpoints.loading import read_weights

from helpers import has_layer, run_cli, run_dirs

RESULTS_ENV = "CONFORMANCE_RESULTS"  # the folder each cell's verdict is written to (conftest.py sets it)
EVAL_SIZES = {0: VAL, 1: 13}  # dataloader_idx -> samples (shapes_data.SeveralEvalLoaders' second split: 13)
WEIGHTS_ATOL, RESUME_ATOL, METRIC_ATOL = 1e-5, 1e-6, 1e-5
#: 6 steps an epoch: the epoch-end save is taken right after step 7 (the next epoch's first), a kill before step 8.
EPOCH_END_KILL_STEP = 8
Verdict = tuple[str, str]  # ("holds" | "refused" | "fails", the detail: the refusal's line, what went wrong)


class CellFails(Exception):
    """A check found the cell neither holding nor refused; its message is the one-line cause."""


def _line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


@dataclass
class Run:
    """One finished ``python -m project fit`` of the lane, in its own folder."""

    cwd: Path
    result: subprocess.CompletedProcess[str]

    def refusal(self, during_training: bool = False) -> str | None:
        """The one ``error:`` line of a refusal before training that left nothing written, else None.

        ``during_training``: a refusal at a step (one line, no traceback); what the run wrote is kept.
        """
        output = self.result.stdout + self.result.stderr
        errors = [line for line in self.result.stderr.splitlines() if line.startswith("error:")]
        logs = self.cwd / "logs"
        written = [p for p in logs.rglob("*") if p.is_file()] if logs.exists() and not during_training else []
        if self.result.returncode <= 0 or "Traceback" in output or len(errors) != 1 or written:
            return None
        return errors[0]

    def failure(self) -> str:
        """What went wrong, in one line: the error line, else the last line of the traceback or the output."""
        lines = [line for line in self.result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:") or "Error:" in line or "Error(" in line]
        last = (errors or lines or ["(no output)"])[-1]
        return _line(f"exit {self.result.returncode}: {last}")

    def checkpoint(self) -> dict[str, Any]:
        """``last.ckpt`` of the run's directory: a file, or a layer's folder (fsdp's shards) merged here."""
        found = run_dirs(self.cwd, "conformance")  # the fit's is the first (a resume continues it; predict adds one)
        path = found[0] / "checkpoints" / "last.ckpt" if found else self.cwd / "missing"
        if not path.exists():
            raise CellFails(f"no last.ckpt in {path.parent}")
        return read_weights(path)

    def records(self, kind: str) -> list[list[str]]:
        """The lines the module wrote to ``seen/<kind>-rank<r>.txt``, split, every rank's."""
        return [line.split() for p in sorted((self.cwd / "seen").glob(f"{kind}-rank*.txt")) for line in p.open()]

    def evaluations(self) -> dict[tuple[str, int, int], Counter[int]]:
        """(kind, step, dataloader_idx) -> how often each sample was evaluated, over the ranks."""
        found: dict[tuple[str, int, int], Counter[int]] = {}
        for kind in ("val", "test", "predict"):
            for step, loader, index in self.records(kind):
                found.setdefault((kind, int(step), int(loader)), Counter())[int(index)] += 1
        return found


def compare(got: dict[str, Any], want: dict[str, Any], keys: tuple[str, ...], atol: float) -> None:
    """The same step, weights (within ``atol``) and user entries ``keys``, else :class:`CellFails` naming the first."""
    if got.get("global_step") != want.get("global_step"):
        raise CellFails(f"last.ckpt at step {got.get('global_step')}, the reference's at {want.get('global_step')}")
    mine, theirs = got["state_dict"], want["state_dict"]
    if mine.keys() != theirs.keys():
        raise CellFails(f"weights named differently: {sorted(set(mine) ^ set(theirs))[:4]}")
    for name, value in theirs.items():
        other = mine[name].to(value.dtype)
        differs = (
            (other - value).abs().max().item() > atol if value.is_floating_point() else not torch.equal(other, value)
        )
        if differs:
            gap = (other - value).abs().max().item() if value.is_floating_point() else "not equal"
            raise CellFails(f"weight {name} differs from the reference's by {gap} (> {atol})")
    for key in keys:
        if got.get(key) != want.get(key):
            raise CellFails(f"checkpoint entry {key!r} is {got.get(key)!r}, the reference's {want.get(key)!r}")


def ends_where_trained(run: Run, checkpoint: dict[str, Any]) -> None:
    """``last.ckpt`` holds the step training ended at (rank 0's ``on_fit_end``)."""
    ended = [int(line[0]) for line in run.records("final")]
    if not ended:
        raise CellFails("on_fit_end never ran")
    if checkpoint.get("global_step") != ended[-1]:
        raise CellFails(f"training ended at step {ended[-1]} but last.ckpt holds step {checkpoint.get('global_step')}")


class Lane:
    """The runs of one test file's cells, each made once, in folders under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[tuple[str, str, str], Run] = {}

    def fit(self, feature: Feature, layout: str, variant: str = "run", *extra: str) -> Run:
        """The feature's fit on ``layout`` (``variant``: its own folder; ``extra`` options after the feature's)."""
        key = (feature.name, layout, variant)
        if key not in self.runs:
            cwd = self.root / f"{len(self.runs):03d}-{variant}"
            cwd.mkdir(parents=True, exist_ok=True)
            args = ["fit", "--config", BASE, *LAYOUTS[layout], *feature.args(), *extra]
            self.runs[key] = Run(cwd, run_cli(args, cwd, timeout=240))
        return self.runs[key]

    def predicted(self, feature: Feature, layout: str, run: Run) -> None:
        """``predict --ckpt_path last`` with the fit's own config, in its folder: one row per sample, once each."""
        key = (feature.name, layout, "predict")
        if key not in self.runs:
            run_dir = run_dirs(run.cwd, "conformance")[0]
            args = ["predict", "--config", str(run_dir / "config.yaml"), "--ckpt_path", "last"]
            self.runs[key] = Run(run.cwd, run_cli(args, run.cwd, timeout=240))
        predicted = self.runs[key]
        if predicted.result.returncode != 0:
            raise CellFails(f"predict after the fit: {predicted.failure()}")
        if not has_layer("predictions"):
            return  # Lightning's own predict: no file to read
        found = run_dirs(run.cwd, "conformance")[-1] / "predictions.csv"
        rows = found.read_text().splitlines()[1:] if found.exists() else []
        pairs = Counter(tuple(row.split(",")[:2]) for row in rows)
        if len(pairs) != sum(EVAL_SIZES.values()) or max(pairs.values(), default=0) != 1:
            raise CellFails(f"predict wrote {len(rows)} rows for {len(pairs)} (loader, index) pairs to {found.name}")

    def started(self, feature: Feature, layout: str) -> Run | Verdict:
        """The cell's fit, or its verdict when it did not train: refused (one line) or failed."""
        run = self.fit(feature, layout)
        if run.result.returncode == 0:
            return run
        line = run.refusal(during_training=bool(feature.refused_at_step))
        if line is None:
            return ("fails", run.failure())
        if feature.refusal_is_a_bug:
            return ("fails", f"refused, but Lightning documents it as working: {line}")
        return ("refused", line)

    def verdict(self, feature: Feature, layout: str, check: str) -> Verdict:
        """Judge one cell."""
        run = self.started(feature, layout)
        if isinstance(run, tuple):
            return run
        try:
            getattr(self, f"check_{check}")(feature, layout, run)
        except CellFails as failure:
            return ("fails", _line(str(failure)))
        return ("holds", "")

    def reference(self, feature: Feature) -> Run:
        """The 1-process run, which must have trained for a 2-process cell to be compared with it."""
        reference = self.started(feature, REFERENCE)
        if isinstance(reference, tuple):
            raise CellFails(f"trains on 2 processes, but the 1-process run {reference[0]}: {reference[1]}")
        return reference

    def check_weights(self, feature: Feature, layout: str, run: Run) -> None:
        """(a): the 1-process reference's weights."""
        mine, reference = run.checkpoint(), self.reference(feature).checkpoint()
        ends_where_trained(run, mine)
        compare(mine, reference, feature.keys, WEIGHTS_ATOL)

    def check_resume_epoch_end(self, feature: Feature, layout: str, run: Run) -> None:
        """(b'): killed right after the first epoch-end save (before step 8), resumed: the uninterrupted run's end."""
        self.check_resume(feature, layout, run, EPOCH_END_KILL_STEP)

    def check_resume(self, feature: Feature, layout: str, run: Run, kill_step: int | None = None) -> None:
        """(b): killed at ``kill_step`` on rank 1, resumed with ``--resume auto``: the uninterrupted run's end."""
        assert layout == RESUME_LAYOUT
        step = feature.kill_step if kill_step is None else kill_step
        kill = callback("faults.KillAtStep", step=step, rank=1)
        killed = self.fit(feature, layout, f"killed-{step}", kill)
        if killed.result.returncode == 0:
            raise CellFails(f"the run ended before step {step}, where rank 1 was to be killed")
        resumed = Run(
            killed.cwd,
            run_cli(
                ["fit", "--config", BASE, *LAYOUTS[layout], *feature.args(), "--resume", "auto"],
                killed.cwd,
                timeout=240,
            ),
        )
        if resumed.result.returncode != 0:
            raise CellFails(f"the resume {resumed.failure()}")
        if "Resuming from" not in resumed.result.stderr:
            raise CellFails("--resume auto started from scratch: no checkpoint was found")
        checkpoint = resumed.checkpoint()
        ends_where_trained(resumed, checkpoint)
        compare(checkpoint, run.checkpoint(), feature.keys, RESUME_ATOL)

    def check_eval_once(self, feature: Feature, layout: str, run: Run) -> None:
        """(c): each evaluation sees each sample once; the same evaluations and metric values as 1 process."""
        if feature.predict:
            self.predicted(feature, layout, run)
        evaluations = run.evaluations()
        if not evaluations:
            raise CellFails("no evaluation ran")
        for (kind, step, loader), counts in sorted(evaluations.items()):
            twice = sorted(i for i, n in counts.items() if n > 1)
            missing = sorted(set(range(feature.evaluated or EVAL_SIZES[loader])) - set(counts))
            if twice or missing:
                where = f"{kind} at step {step}, loader {loader}"
                raise CellFails(f"{where}: samples seen more than once {twice[:6]}, never {missing[:6]}")
        if layout == REFERENCE or "weights" in feature.skip:
            return  # where a run stops is not reproducible: its evaluations cannot be compared
        reference = self.reference(feature)
        if feature.predict:
            self.predicted(feature, REFERENCE, reference)
        if set(evaluations) != set(reference.evaluations()):
            raise CellFails(
                f"evaluated at {sorted(evaluations)[:6]}, on 1 process at {sorted(reference.evaluations())[:6]}"
            )
        want = {step: float(value) for step, value in reference.records("metric")}
        for step, value in run.records("metric"):
            if abs(float(value) - want.get(step, float("nan"))) <= METRIC_ATOL:
                continue
            raise CellFails(f"a rank's whole-set metric at step {step} is {value}, on 1 process {want.get(step)}")


def record(feature: str, layout: str, check: str, verdict: Verdict) -> None:
    """Write the cell's verdict where the session collects them (nothing when the lane runs outside conftest)."""
    folder = os.environ.get(RESULTS_ENV)
    if folder:
        name = hashlib.sha1(f"{feature}|{layout}|{check}".encode()).hexdigest()[:16] + ".json"
        payload = {"feature": feature, "layout": layout, "check": check, "verdict": verdict[0], "detail": verdict[1]}
        (Path(folder) / name).write_text(json.dumps(payload))
