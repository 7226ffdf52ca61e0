"""``plan`` for the layer's layouts: fsdp and its memory beside ddp and zero1, a pipeline's stages, the GPU fsdp
config on CPU processes (from tests/cli/test_cli.py and test_lightning_shapes.py).
"""

from __future__ import annotations

import importlib.util
import json

from project.models.digits_net import DigitsNet

from helpers import CONFIGS, DIGITS, run_cli


def test_plan_for_8_gpus_shows_fsdp_precision_compile_and_memory_beside_ddp(tmp_path):
    args = ["plan", "--config", DIGITS, "--assume_gpus", "8", "--json", "--parallel.scenario", "fsdp"]
    compiles = ["--parallel.compile", "true"] if importlib.util.find_spec("project.extras.compile") else []
    result = run_cli([*args, "--parallel.precision", "bf16-mixed", *compiles], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["strategy"]["name"] == "fsdp" and data["strategy"]["fsdp"]["sharding"] == "full"
    assert data["precision"] == "bf16-mixed" and data.get("compile", False) is bool(compiles)
    memory = data["memory"]
    assert memory["planned"] == "fsdp" and "activations" in memory["note"]
    # Counted from the model the config builds (DigitsNet 64-256-256-10 with BatchNorm) and its AdamW.
    net = DigitsNet(hidden=256, batch_norm=True)
    param_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    assert memory["model"]["parameter_bytes"] == param_bytes
    assert memory["optimizer"]["class_path"] == "torch.optim.adamw.AdamW"
    ddp, fsdp = memory["per_device"]["ddp"], memory["per_device"]["fsdp"]
    assert ddp["parameters"]["bytes"] == param_bytes and ddp["gradients"]["bytes"] == param_bytes
    assert fsdp["shard_degree"] == 8 and fsdp["parameters"]["bytes"] == -(-param_bytes // 8)
    assert fsdp["total"]["bytes"] < ddp["total"]["bytes"] / 4
    text = run_cli(["plan", "--config", DIGITS, "--assume_gpus", "8", "--parallel.precision", "bf16-mixed"], tmp_path)
    assert text.returncode == 0, text.stderr[-3000:]
    for words in ("memory per device", "ddp (planned)", "zero1 / 8", "fsdp full / 8", "optimizer state"):
        assert words in text.stdout, text.stdout
    assert "bf16-mixed" in text.stdout and "Not counted: activations" in " ".join(text.stdout.split())


def test_the_fsdp_config_plans_on_cpu_processes_with_gloo(tmp_path):
    fsdp = str(CONFIGS / "sharding" / "fsdp.yaml")
    result = run_cli(["plan", "--config", DIGITS, "--config", fsdp, "--parallel.devices", "2", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads(result.stdout.splitlines()[-1])
    assert plan["backend"] == "gloo" and plan["scenario"] == "fsdp" and plan["world_size"] == 2
