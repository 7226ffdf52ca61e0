"""docs/conformance.md written from the lane's verdicts: the compatibility table users read.

``conftest.py`` calls :func:`write_report` at the end of a session that judged every cell of the matrix (a run of
part of the lane, ``-k`` or one file, leaves the committed page alone).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from conformance.matrix import CHECKS, FEATURES, LAYOUTS, Feature, cells, not_applicable

from helpers import REPO

DOC = REPO / "docs" / "conformance.md"
DEFAULTS = (Feature.model, Feature.data)  # the plain module and datamodule every feature changes
MARK = {"holds": "holds", "refused": "refused", "fails": "**FAILS**"}

INTRO = """# Conformance: Lightning's features on every layout

Your own `LightningModule` gets every guarantee, or a one-line refusal before training. This page is that
promise checked feature by feature: one small plain-Lightning module, datamodule, callback or Trainer option per
documented Lightning feature that touches training state, data or evaluation (written as users write them, in
[`tests/conformance/`](../tests/conformance/)), run on each layout, each cell checked in up to four ways (a resume
from two checkpoint positions):

{checks}

A cell **holds**, or is **refused**: exit non-zero with one `error:` line before training, nothing written. A
**FAILS** cell does neither: the lane fails until it is fixed. A check that does not apply says why. One feature
can only be refused when it happens, because it depends on the data (a `training_step` that returns None on several
processes, a monitor checked at the first validation when there is no sanity check): its refusal is one `error:`
line at that step, no traceback, and the run keeps what it wrote.

This page is generated: `make conformance` runs the lane (`tests/conformance`, marker `conformance`, two pytest-xdist
workers) and rewrites it when every cell was judged. CI (`.ci/run`) runs `make test`, `make test-slow`, then
`make conformance`.
`tests/unit/test_conformance_docs.py` checks that every feature the lane defines is listed here.
"""


def _cell(results: dict[tuple[str, str, str], dict], feature: Feature, layout: str) -> str:
    parts = []
    for check in CHECKS:
        reason = not_applicable(feature, layout, check)
        found = results.get((feature.name, layout, check))
        if reason is not None:
            parts.append(f"{check}: n/a")
        elif found is None:
            parts.append(f"{check}: not run")
        else:
            parts.append(f"{check}: {MARK[found['verdict']]}")
    return "<br>".join(parts)


def _code(feature: Feature) -> str:
    """The user code a feature plugs in, where it is not the plain module and datamodule."""
    own = [name for name in (feature.model, feature.data) if name not in DEFAULTS]
    return "".join(f" (`{name}`)" for name in own)


def _details(results: dict[tuple[str, str, str], dict]) -> list[str]:
    lines = ["## Refusals and failures", "", "The line each refused cell printed, and what each failing cell did.", ""]
    found = [r for r in results.values() if r["verdict"] != "holds"]
    for r in sorted(found, key=lambda r: (r["verdict"], r["feature"], r["layout"], r["check"])):
        lines.append(f"- {MARK[r['verdict']]}: {r['feature']} / {r['layout']} / {r['check']}: `{r['detail']}`")
    return lines + (["- none"] if not found else [])


def _not_applicable() -> list[str]:
    lines = ["## Checks that do not apply", ""]
    reasons: dict[str, list[str]] = {}
    for feature in FEATURES:
        for layout in LAYOUTS:
            for check in CHECKS:
                reason = not_applicable(feature, layout, check)
                if reason is not None:
                    reasons.setdefault(f"{check}: {reason}", []).append(f"{feature.name} / {layout}")
    for reason, where in reasons.items():
        shown = "every feature" if len(where) >= len(FEATURES) else "; ".join(where)
        lines.append(f"- {reason} ({shown})")
    return lines


def render(results: dict[tuple[str, str, str], dict], seconds: float, when: str) -> str:
    """The page for these verdicts, the lane's wall time and the time it ran."""
    checks = "\n".join(f"- **{name}** {text}" for name, text in CHECKS.items())
    load = ", load average {:.1f} / {:.1f} / {:.1f} at its end (1 / 5 / 15 min)".format(*os.getloadavg())
    held = sum(r["verdict"] != "fails" for r in results.values())
    header = "| feature | what the user wrote | " + " | ".join(LAYOUTS) + " |"
    rows = [header, "|" + " --- |" * (2 + len(LAYOUTS))]
    for feature in FEATURES:
        cells_of = " | ".join(_cell(results, feature, layout) for layout in LAYOUTS)
        rows.append(f"| {feature.name} | {feature.what}{_code(feature)} | {cells_of} |")
    summary = [
        "## The matrix",
        "",
        f"Generated {when} by `make conformance`: {len(FEATURES)} features, {len(results)} cells judged, "
        f"{held} hold or are refused, {len(results) - held} fail. The lane took {seconds / 60:.1f} min "
        f"({seconds:.0f} s) with two workers on {os.cpu_count()} cores{load}. The target is at most 10 minutes on 2 "
        "quiet cores; a wall time measured beside other work (a load average above the cores) says little about it.",
        "",
    ]
    parts = [INTRO.format(checks=checks), *summary, *rows, "", *_details(results), "", *_not_applicable(), ""]
    return "\n".join(parts)


def write_report(folder: Path, seconds: float) -> bool:
    """docs/conformance.md from the verdicts in ``folder``, if every cell was judged; whether it was written."""
    results = {}
    for path in folder.glob("*.json"):
        r = json.loads(path.read_text())
        results[(r["feature"], r["layout"], r["check"])] = r
    if set(results) != set(cells()):
        return False
    DOC.write_text(render(results, seconds, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    return True
