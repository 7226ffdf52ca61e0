"""The per-device memory estimate of ``plan``: counted from the built model and the configured optimizer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from project.extras.sharding.plan.memory import ModelCount, human, per_device, shard_degree
from project.extras.sharding.plan.optimizer_count import OptimizerCount, count_optimizer
from project.models.classifier import Classifier
from project.models.digits_net import DigitsNet

ADAMW = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.003, "weight_decay": 0.0001}}


def sgd(momentum: float) -> dict:
    return {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1, "momentum": momentum}}


def test_model_count_reads_every_tensor_by_its_own_dtype():
    net = nn.Sequential(nn.Linear(10, 5), nn.BatchNorm1d(5), nn.Linear(5, 2).to(torch.bfloat16))
    net[1].weight.requires_grad_(False)
    count = ModelCount.of(net)
    assert count.parameters == 55 + 10 + 12
    assert count.parameter_bytes == (55 + 10) * 4 + 12 * 2
    assert count.trainable == 55 + 5 + 12 and count.trainable_bytes == (55 + 5) * 4 + 12 * 2
    assert count.buffer_bytes == 5 * 4 * 2 + 8  # running mean and var, num_batches_tracked (int64)
    assert count.dtypes == ("bfloat16", "float32")


@pytest.mark.parametrize(
    ("section", "states"),
    [(ADAMW, 2), ({"class_path": "torch.optim.Adam", "init_args": {"amsgrad": True}}, 3), (sgd(0.9), 1), (sgd(0), 0)],
)
def test_optimizer_state_is_counted_by_one_step_on_meta_tensors(section, states):
    net = DigitsNet(hidden=16)
    before = [p.detach().clone() for p in net.parameters()]
    count = count_optimizer(net, section)
    param_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    assert count.states_per_parameter == pytest.approx(states, abs=0.01) and count.source.startswith("counted")
    # Adam's step counters are scalars: a few bytes per parameter tensor on top of the states.
    assert states * param_bytes <= count.state_bytes <= states * param_bytes + 8 * len(before)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))  # nothing touched


def test_an_optimizer_that_cannot_step_on_meta_tensors_falls_back_to_adams_two_states_and_says_so():
    net = DigitsNet(hidden=16)
    param_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    lbfgs = count_optimizer(net, {"class_path": "torch.optim.LBFGS", "init_args": {"lr": 1.0}})
    assert lbfgs.state_bytes == 2 * param_bytes and "assumed 2 states" in lbfgs.source and "closure" in lbfgs.source
    missing = count_optimizer(net, {"class_path": "torch.optim.NoSuchOptimizer", "init_args": {}})
    assert missing.class_path is None and "does not import" in missing.source
    none = count_optimizer(Classifier(net), None)  # no section, and Classifier leaves the optimizer to the CLI
    assert "assumed" in none.source


def test_per_device_bytes_under_ddp_and_each_fsdp_sharding():
    count = ModelCount("M", 1000, 1000, parameter_bytes=4000, trainable_bytes=4000, buffer_bytes=100, dtypes=())
    optimizer = OptimizerCount("torch.optim.adamw.AdamW", 8000, 2.0, "counted")
    ddp = per_device(count, optimizer, 1, None)
    assert (ddp["parameters"]["bytes"], ddp["gradients"]["bytes"], ddp["optimizer_state"]["bytes"]) == (
        4000,
        4000,
        8000,
    )
    assert ddp["total"]["bytes"] == 16100 and ddp["total"]["human"] == "15.7 KiB"
    full = per_device(count, optimizer, 8, "full")
    assert (full["parameters"]["bytes"], full["gradients"]["bytes"], full["optimizer_state"]["bytes"]) == (
        500,
        500,
        1000,
    )
    assert full["buffers"]["bytes"] == 100 and full["total"]["bytes"] == 2100  # buffers are not sharded
    grad_op = per_device(count, optimizer, 8, "grad_op")
    assert grad_op["parameters"]["bytes"] == 4000 and grad_op["gradients"]["bytes"] == 500
    assert shard_degree("hybrid", dp_size=16, per_node=8) == 8 and shard_degree("full", 16, 8) == 16
    odd = per_device(count, optimizer, 3, "full")
    assert odd["parameters"]["bytes"] == 1334  # padded up to whole shards
    offload = per_device(count, optimizer, 8, "full", cpu_offload=True)
    assert offload["total"]["bytes"] == 100 and offload["offloaded_to_host"]["bytes"] == 2000


def test_human_units():
    assert [human(n) for n in (0, 1023, 1024, 1536, 5 * 1024**3)] == ["0 B", "1023 B", "1 KiB", "1.5 KiB", "5 GiB"]
    assert human(1012 * 1024) == "1012 KiB" and human(150 * 1024 + 600) == "151 KiB"


@pytest.mark.parametrize(
    "optimizer", [torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD, torch.optim.RMSprop, torch.optim.Adagrad]
)
def test_the_optimizer_a_module_configures_itself_is_counted(optimizer):
    """A module's own configure_optimizers (AdamW keeps a `decoupled_weight_decay` its constructor does not take)."""

    class Own(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = DigitsNet(hidden=16)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer(self.parameters(), lr=0.01)

    count = count_optimizer(Own(), None)
    assert count.source.startswith("counted"), count.source
    assert count.class_path.endswith(optimizer.__name__)
