"""Which units each pipeline stage holds (project.extras.sharding.plan.pipeline_plan): pure, on the meta device."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from user_pipeline import SequentialRegressor

from project.errors import UserError
from project.extras.sharding.plan.pipeline_plan import assign_stages, pipeline_units, plan_stages

# The bundled GPT is the layer's own example of a long network (its blocks split evenly): the gpt layer's.
GPT = pytest.importorskip("project.extras.gpt.gpt").GPT


def gpt(n_layer: int = 4) -> GPT:
    with torch.device("meta"):
        return GPT(vocab="abcd", block_size=8, n_layer=n_layer, n_head=2, n_embd=8)


def test_the_gpt_is_cut_between_its_blocks_evenly_and_every_parameter_counted_once():
    net = gpt()
    stages = assign_stages(net, 2)
    assert stages[0].modules == ("tok_emb", "pos_emb", "drop", "blocks.0", "blocks.1")
    assert stages[1].modules == ("blocks.2", "blocks.3", "ln_f", "lm_head")
    assert sum(stage.parameters for stage in stages) == sum(p.numel() for p in net.parameters())
    assert [s.modules[0] for s in assign_stages(net, 4)[1:]] == ["blocks.1", "blocks.2", "blocks.3"]


def test_split_points_and_the_modules_own_method_choose_the_boundaries():
    assert assign_stages(gpt(), 2, ["blocks.3"])[1].modules == ("blocks.3", "ln_f", "lm_head")
    module = SequentialRegressor()
    assert pipeline_units(module.net)[:3] == ["0", "1", "2"]
    assert plan_stages(module, 2)[1].modules == ("6", "7", "8")


@pytest.mark.parametrize(
    ("stages", "points", "needle"),
    [
        (5, None, "more stages than the 4 blocks of GPT"),
        (2, ["blocks.9"], "'blocks.9' is not a unit of GPT"),
        (3, ["blocks.2", "blocks.1"], "in forward order"),
        (3, ["blocks.2"], "3 stages need 2"),
    ],
)
def test_an_impossible_split_is_one_line(stages, points, needle):
    with pytest.raises(UserError, match=needle) as caught:
        assign_stages(gpt(), stages, points)
    assert "\n" not in str(caught.value) and "parallel.pipeline_parallel" in str(caught.value)


def test_a_module_without_a_network_attribute_is_refused_naming_the_attributes():
    with pytest.raises(UserError, match=r"self\.net, self\.model, self\.network"):
        plan_stages(nn.Module(), 2)
