"""`plan` of the GPT cut into pipeline stages: the degrees and each stage's modules (needs the sharding layer)."""

from __future__ import annotations

import json

import pytest

from helpers import CONFIGS, run_cli

pytest.importorskip("project.extras.sharding")  # pipeline parallelism is the sharding layer's


def test_plan_for_8_gpus_shows_the_pipeline_degrees_and_each_stage(tmp_path):
    chargpt = str(CONFIGS / "gpt" / "chargpt.yaml")
    args = ["plan", "--config", chargpt, "--parallel.scenario", "ddp", "--parallel.pipeline_parallel.size", "2"]
    result = run_cli([*args, "--assume_gpus", "8", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["degrees"] == {"pp": 2, "dp_replicate": 4, "dp_shard": 1, "tp": 1, "dp": 4}
    pipeline = data["strategy"]["pipeline"]
    assert data["strategy"]["name"] == "pipeline" and pipeline["schedule"] == "1f1b"
    # configs/gpt/chargpt.yaml's GPT has 4 blocks: two per stage, embeddings first, the head last; no layer twice
    stages = [stage["modules"] for stage in pipeline["stages"]]
    assert stages == [
        ["tok_emb", "pos_emb", "drop", "blocks.0", "blocks.1"],
        ["blocks.2", "blocks.3", "ln_f", "lm_head"],
    ]
    assert sum(stage["parameters"] for stage in pipeline["stages"]) == data["memory"]["model"]["parameters"]
    # the table shows the same: the degrees and the stages' units
    table = run_cli([*args, "--assume_gpus", "8"], tmp_path)
    assert table.returncode == 0, table.stderr[-3000:]
    assert '"pp": 2' in table.stdout and "blocks.3" in table.stdout, table.stdout
