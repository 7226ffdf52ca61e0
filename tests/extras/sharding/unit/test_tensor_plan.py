"""``parallel.tensor_parallel`` and ``parallel.precision: 64`` in the plan: degrees, the styles ``auto`` finds, and
every impossible layout refused in one line before anything starts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from project.errors import UserError
from project.extras.sharding.plan.config import TensorParallel
from project.extras.sharding.plan.memory import estimate
from project.extras.sharding.plan.tensor_plan import HOOK, resolve_tensor_plan, split_parameter_names
from project.plan.environment import LaunchEnvironment
from project.plan.layout import Layout
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

LOCAL = LaunchEnvironment(launcher="lightning", external=False)


def plan(tp: int, **fields):
    config = ParallelConfig(tensor_parallel=TensorParallel(size=tp), **fields)
    return resolve_plan(config, Hardware(0), LOCAL, 32)


class Attention(nn.Module):
    def __init__(self, width: int = 8, heads: int = 4) -> None:
        super().__init__()
        self.n_head = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(width, width) for _ in range(4))


class Block(nn.Module):
    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.attn = Attention(heads=heads)
        self.mlp = nn.Module()
        self.mlp.up, self.mlp.down = nn.Linear(8, 32), nn.Linear(32, 8)
        self.norm = nn.LayerNorm(8)


def test_tensor_parallel_is_the_innermost_degree_and_fsdp_makes_it_two_dimensional():
    assert plan(2, scenario="cpu", devices=2).layout.to_dict() == {
        "pp": 1,
        "dp_replicate": 1,
        "dp_shard": 1,
        "tp": 2,
        "dp": 1,
    }
    assert plan(2, scenario="cpu", devices=2).strategy == "tensor_parallel"
    two_d = plan(2, scenario="fsdp", devices=4)
    assert (two_d.layout.dp_replicate, two_d.layout.dp_shard, two_d.layout.tp) == (1, 2, 2)
    assert two_d.strategy == "fsdp"
    assert two_d.dp_size == 2 and [two_d.dp_rank(rank) for rank in range(4)] == [0, 0, 1, 1]


@pytest.mark.parametrize(
    ("tp", "fields", "needle"),
    [
        (3, {"scenario": "cpu", "devices": 4}, "does not divide the world size 4"),
        (2, {"scenario": "cpu", "devices": 4}, "use scenario 'fsdp'"),
        (2, {"scenario": "zero1", "devices": 2}, "tensor parallelism runs with scenario"),
        (0, {"scenario": "cpu", "devices": 2}, "must be >= 1"),
        (2, {"scenario": "fsdp", "devices": 2, "num_nodes": 2, "fsdp": {"sharding": "hybrid"}}, "sharding 'hybrid'"),
    ],
)
def test_an_impossible_layout_is_one_line(tp, fields, needle):
    with pytest.raises(UserError) as info:
        plan(tp, **fields)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_auto_splits_the_gpt_names_and_sequential_linear_pairs():
    styles = resolve_tensor_plan(nn.ModuleDict({"block": Block()}), "auto", 2)
    assert styles == {
        "block.attn.q_proj": "colwise", "block.attn.k_proj": "colwise", "block.attn.v_proj": "colwise",
        "block.attn.out_proj": "rowwise", "block.mlp.up": "colwise", "block.mlp.down": "rowwise",
    }  # fmt: skip
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.0), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    assert resolve_tensor_plan(mlp, "auto", 2) == {"0": "colwise", "3": "rowwise"}  # the norm ends the pair


@pytest.mark.parametrize(
    ("model", "spec", "needle"),
    [
        (nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)), "auto", "5 output features, not divisible by"),
        (nn.ModuleDict({"b": Block(heads=3)}), "auto", "n_head=3 attention heads"),
        (nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), {"layers.*": "colwise"}, "matches no module"),
        (nn.Sequential(nn.Linear(4, 8)), {"0": "diagonal"}, "is not one of colwise"),
        (nn.Sequential(nn.LayerNorm(4)), {"0": "colwise"}, "split nn.Linear and nn.Embedding only"),
        (nn.Sequential(nn.LayerNorm(4)), {"0": "sequence"}, "'sequence' is not built"),
        (nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)), "auto", "found nothing to split"),
    ],
)
def test_a_plan_that_cannot_apply_is_one_line(model, spec, needle):
    with pytest.raises(UserError) as info:
        resolve_tensor_plan(model, spec, 2)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_module_with_its_own_parallelize_method_is_handed_the_mesh():
    class Own(nn.Sequential):
        def parallelize(self, mesh) -> None: ...

    assert resolve_tensor_plan(Own(nn.Linear(4, 4)), "auto", 2) == {"": HOOK}


def test_memory_divides_the_split_layers_and_precision_64_doubles_every_byte():
    mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    names = split_parameter_names(mlp, resolve_tensor_plan(mlp, "auto", 2))
    assert names == {"0.weight", "0.bias", "2.weight"}  # the rowwise bias is added after the all-reduce: whole
    split = sum(p.numel() * 4 for n, p in mlp.named_parameters() if n in names)
    split_2 = Layout("cpu", "cpu", 2, 1, dp_replicate=1, tp=2)
    whole_2 = Layout("cpu", "cpu", 2, 1, dp_replicate=2)
    common = {"planned": "ddp", "sharding": "full", "cpu_offload": False}
    whole = estimate(mlp, None, layout=whole_2, precision="32", **common)
    halved = estimate(mlp, None, layout=split_2, precision="32", tensor_split=(split, split), **common)
    doubled = estimate(mlp, None, layout=whole_2, precision="64", **common)
    total = sum(p.numel() * 4 for p in mlp.parameters())
    assert whole["per_device"]["ddp"]["parameters"]["bytes"] == total
    assert halved["per_device"]["ddp"]["parameters"]["bytes"] == total - split // 2
    assert doubled["per_device"]["ddp"]["parameters"]["bytes"] == 2 * total
    assert (
        doubled["per_device"]["ddp"]["optimizer_state"]["bytes"]
        == 2 * whole["per_device"]["ddp"]["optimizer_state"]["bytes"]
    )
    assert torch.float32 == next(mlp.parameters()).dtype  # the plan counted, it converted nothing


class _TiedHead(nn.Module):
    """An embedding and a head sharing its weight, with a splittable MLP between (a tied LM in miniature)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight


def test_a_tied_module_is_never_split_and_the_rest_of_the_plan_is():
    model = _TiedHead()
    assert resolve_tensor_plan(model, {"mlp.0": "colwise", "mlp.2": "rowwise"}, 2) == {
        "mlp.0": "colwise",
        "mlp.2": "rowwise",
    }
    with pytest.raises(UserError, match=r"splits head \(colwise\), whose weight is tied to a module outside it"):
        resolve_tensor_plan(model, {"head": "colwise"}, 2)
