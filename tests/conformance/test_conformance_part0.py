"""Conformance cells, part 0 of 3 (features 0, 3, 6, ... of conformance.matrix.FEATURES): each holds or is
refused in one line before training (docs/conformance.md). Three files, so that two xdist workers share the lane."""

from __future__ import annotations

import pytest
from conformance.matrix import BY_NAME, FEATURES, cells
from conformance.support import Lane, record

PART = {feature.name for feature in FEATURES[0::3]}


@pytest.fixture(scope="module")
def lane(tmp_path_factory) -> Lane:
    """This file's runs, each made once and shared by its cells."""
    return Lane(tmp_path_factory.mktemp("conformance-0"))


@pytest.mark.parametrize(("feature", "layout", "check"), [cell for cell in cells() if cell[0] in PART])
def test_cell_holds_or_is_refused_in_one_line(lane: Lane, feature: str, layout: str, check: str) -> None:
    verdict = lane.verdict(BY_NAME[feature], layout, check)
    record(feature, layout, check, verdict)
    assert verdict[0] in ("holds", "refused"), f"{feature} / {layout} / {check}: {verdict[1]}"
