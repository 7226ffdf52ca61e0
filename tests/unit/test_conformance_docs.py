"""docs/conformance.md, the compatibility table `make conformance` generates, lists what the lane defines.

The page is rewritten only by a run of the whole lane; these checks (no training) keep the committed page and the
feature table in tests/conformance/matrix.py from drifting apart.
"""

from __future__ import annotations

import re

from conformance.matrix import ALL_LAYOUTS, CHECKS, FEATURES, LAYOUTS, cells, not_applicable
from conformance.report import DOC, render


def _rows() -> dict[str, str]:
    """Feature name -> its table row, from the committed page."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\| ([^|]+?) \| .*\|$", line)
        if match:
            rows[match.group(1)] = line
    return rows


def test_the_page_lists_every_feature_the_lane_defines_and_no_other():
    rows = _rows()
    defined = {feature.name for feature in FEATURES}
    listed = set(rows) - {"feature"} - {name for name in rows if set(name) <= set("- ")}
    assert defined - listed == set(), f"docs/conformance.md lacks {sorted(defined - listed)}: run `make conformance`"
    assert listed - defined == set(), (
        f"docs/conformance.md lists {sorted(listed - defined)}, which the lane no longer defines"
    )
    assert len(FEATURES) >= 25


def test_the_page_has_a_column_per_layout_and_a_verdict_per_check():
    rows = _rows()
    # The page is a run of the whole lane with every layer: a stripped layer's columns stay until the next run.
    assert [column.strip(" |") for column in rows["feature"].split(" | ")[2:]] == list(ALL_LAYOUTS)
    for feature in FEATURES:
        for cell in rows[feature.name].split(" | ")[2:]:
            assert [part.split(":")[0] for part in cell.strip(" |").split("<br>")] == list(CHECKS), feature.name
    assert "not run" not in DOC.read_text(encoding="utf-8")


def test_a_page_rendered_from_verdicts_marks_each_cell_and_gives_each_failure_its_line():
    results = {
        cell: {"feature": cell[0], "layout": cell[1], "check": cell[2], "verdict": "holds", "detail": ""}
        for cell in cells()
    }
    first = cells()[0]
    results[first] = {**results[first], "verdict": "fails", "detail": "exit 1: RuntimeError: boom"}
    page = render(results, 61.0, "2026-12-05 02:00 UTC")
    assert f"{len(results)} cells judged, {len(results) - 1} hold or are refused, 1 fail" in page
    assert f"- **FAILS**: {first[0]} / {first[1]} / {first[2]}: `exit 1: RuntimeError: boom`" in page
    assert "The lane took 1.0 min (61 s) with two workers on" in page and "load average" in page
    skipped = [
        (f.name, layout, check)
        for f in FEATURES
        for layout in LAYOUTS
        for check in CHECKS
        if not_applicable(f, layout, check)
    ]
    assert skipped and all(cell not in results for cell in skipped)
