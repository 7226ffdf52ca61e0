"""The memory table of ``plan`` at its edges (from the mutation pass, docs/mutation-plan.md): the fsdp column when
the plan runs fsdp or would, the zero1 column, offload, mixed precision, and how the optimizer is found.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from project.extras.sharding.plan.memory import ModelCount, estimate, human
from project.extras.sharding.plan.optimizer_count import count_optimizer
from project.plan.layout import Layout

SGD = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1, "momentum": 0.9}}


def table(
    planned: str = "ddp",
    layout: Layout | None = None,
    sharding: str = "full",
    cpu_offload: bool = False,
    precision: str = "32",
    section: dict | None = SGD,
) -> dict:
    layout = layout or Layout("cpu", "cpu", 4, 1, dp_replicate=4)
    return estimate(
        nn.Linear(100, 10),
        section,
        planned=planned,
        layout=layout,
        sharding=sharding,
        cpu_offload=cpu_offload,
        precision=precision,
    )


PARAM_BYTES = (100 * 10 + 10) * 4


def test_each_column_holds_what_its_strategy_keeps():
    got = table()["per_device"]
    assert got["ddp"]["shard_degree"] == 1 and "sharding" not in got["ddp"]
    assert got["ddp"]["parameters"]["bytes"] == PARAM_BYTES and got["ddp"]["optimizer_state"]["bytes"] == PARAM_BYTES
    zero1 = got["zero1"]
    assert (zero1["shard_degree"], zero1["sharding"]) == (4, "zero1")
    assert zero1["parameters"]["bytes"] == PARAM_BYTES and zero1["gradients"]["bytes"] == PARAM_BYTES
    assert zero1["optimizer_state"]["bytes"] == PARAM_BYTES // 4
    assert (got["fsdp"]["shard_degree"], got["fsdp"]["sharding"]) == (4, "full")


def test_the_configured_optimizer_is_the_one_counted():
    assert table()["optimizer"]["class_path"] == "torch.optim.sgd.SGD"
    assert table(section={"class_path": "torch.optim.Adam"})["optimizer"]["class_path"] == "torch.optim.adam.Adam"


def test_the_planned_fsdp_column_takes_the_layouts_shard_degree():
    got = table("fsdp", Layout("fsdp", "gpu", 4, 2, dp_replicate=2, dp_shard=4), sharding="hybrid")
    assert got["planned"] == "fsdp" and got["per_device"]["fsdp"]["shard_degree"] == 4


def test_hybrid_would_shard_within_a_node_of_data_parallel_ranks():
    got = table("ddp", Layout("ddp", "gpu", 4, 2, dp_replicate=8), sharding="hybrid")
    assert got["per_device"]["fsdp"]["shard_degree"] == 4
    # Tensor-parallel groups share their data: a node of 8 processes holds 4 data-parallel ranks.
    got = table("ddp", Layout("ddp", "gpu", 8, 1, dp_replicate=4, tp=2), sharding="hybrid")
    assert json.dumps(got["per_device"]["fsdp"]["shard_degree"]) == "4"


def test_offload_moves_the_fsdp_shards_to_host_memory():
    got = table(cpu_offload=True)["per_device"]
    assert got["fsdp"]["total"]["bytes"] == 0 and got["fsdp"]["offloaded_to_host"]["bytes"] > 0
    assert "offloaded_to_host" not in got["ddp"] and "offloaded_to_host" not in got["zero1"]


def test_mixed_precision_says_the_state_stays_float32():
    assert "bf16-mixed keeps float32 parameters, gradients and optimizer state" in table(precision="bf16-mixed")["note"]
    assert table()["note"].startswith("Persistent state per device. Not counted: activations")


def test_the_model_is_named_by_its_class():
    assert ModelCount.of(nn.Linear(2, 2)).name == "Linear" and table()["model"]["name"] == "Linear"


def test_units_go_up_to_pebibytes_and_no_further():
    assert human(2 * 1024**5) == "2 PiB" and human(2048 * 1024**5) == "2048 PiB"


def test_the_states_per_parameter_are_shown_to_three_places():
    net = nn.Linear(2, 2)  # Adam's scalar step counters make the ratio a little above 2
    count = count_optimizer(net, {"class_path": "torch.optim.Adam"})
    exact = count.state_bytes / (6 * 4)
    assert exact != round(exact, 3) and count.states_per_parameter == round(exact, 3)
    assert count.class_path == "torch.optim.adam.Adam"


def test_a_model_with_nothing_to_train_keeps_no_optimizer_state():
    net = nn.Linear(4, 4).requires_grad_(False)
    count = count_optimizer(net, SGD)
    assert (count.state_bytes, count.states_per_parameter) == (0, 0.0) and count.source.startswith("counted")


def test_a_module_without_an_optimizer_says_so():
    count = count_optimizer(nn.Linear(4, 4), None)
    assert count.class_path is None and "no optimizer in the config or configure_optimizers()" in count.source


class _Configured(nn.Module):
    def __init__(self, shape: str) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.shape = shape

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        if self.shape == "dict":
            return {"optimizer": optimizer, "lr_scheduler": scheduler}
        return [[optimizer], [scheduler]]


def test_the_optimizer_a_module_returns_with_its_scheduler_is_found():
    for shape in ("dict", "lists"):
        count = count_optimizer(_Configured(shape), None)
        assert count.class_path == "torch.optim.sgd.SGD" and count.states_per_parameter == 1.0, shape


def test_a_failed_meta_step_names_the_error():
    count = count_optimizer(nn.Linear(4, 4), {"class_path": "torch.optim.LBFGS", "init_args": {"lr": 1.0}})
    assert "one step on meta tensors failed: TypeError:" in count.source, count.source
    assert (count.class_path, count.states_per_parameter) == ("torch.optim.lbfgs.LBFGS", 2.0)
