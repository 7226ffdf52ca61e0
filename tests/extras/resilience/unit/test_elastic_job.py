"""An elastic torchrun job, read without processes: the agent's node range, and the global batch a restart keeps."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import yaml

from project.extras.resilience.elastic.job import (
    ElasticJob,
    detect_elastic,
    keep_checkpoint_batch,
    nnodes_argument,
    parse_range,
)
from project.extras.resilience.elastic.peer_loss import as_saved_at_batch_end
from project.plan.config import ParallelConfig
from project.plan.environment import detect_environment

from helpers import REPO

TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "job", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0"}


def test_the_node_range_is_read_from_the_agents_command_line_up_to_the_workers_module():
    agent = ["/venv/bin/python", "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "2", "-m"]
    assert nnodes_argument([*agent, "project", "fit", "--nnodes", "9"]) == "1:2"
    assert nnodes_argument(["/usr/bin/torchrun", "--nnodes=2:4", "-m", "project"]) == "2:4"
    assert nnodes_argument(["/venv/bin/python", "-m", "torch.distributed.run", "--standalone", "-m", "project"]) is None
    assert [parse_range(v) for v in ("1:2", "3", "0:2", "2:1", "a:b", None)] == [(1, 2), (3, 3), None, None, None, None]


def test_an_elastic_job_is_torchrun_with_a_range_and_a_fixed_size_is_not(tmp_path):
    environment = detect_environment(TORCHRUN_ENV)
    job = detect_elastic(environment, {**TORCHRUN_ENV, "PET_NNODES": "1:3", "TORCHELASTIC_RESTART_COUNT": "2"})
    assert job == ElasticJob(1, 3, 2, "job") and job.describe() == "--nnodes 1:3"
    assert detect_elastic(environment, {**TORCHRUN_ENV, "PET_NNODES": "2"}) is None
    # This test process's parent is no torchrun agent: nothing says the job is elastic.
    assert detect_elastic(environment, TORCHRUN_ENV, ppid=os.getpid()) is None
    assert detect_elastic(detect_environment({}), {"PET_NNODES": "1:2"}) is None


def test_a_restart_keeps_the_checkpoints_global_batch_unless_the_config_sets_the_batch():
    job, saved = ElasticJob(1, 2, 1, "job"), {"global_batch_size": 256, "accumulation": 1, "batches_done": 3}
    kept = keep_checkpoint_batch(ParallelConfig(devices=2), saved, job)
    assert (kept.global_batch_size, kept.accumulation) == (256, 1)
    assert keep_checkpoint_batch(ParallelConfig(devices=2), saved, None) == ParallelConfig(devices=2)
    assert keep_checkpoint_batch(ParallelConfig(devices=2), None, job) == ParallelConfig(devices=2)
    given = ParallelConfig(devices=2, per_device_batch_size=32)
    assert keep_checkpoint_batch(given, saved, job) == given


def test_the_elastic_pytorchjob_runs_the_documented_command_under_torchrun():
    manifest = yaml.safe_load(Path(REPO / "scripts" / "kubeflow" / "pytorchjob-elastic.yaml").read_text())
    policy = manifest["spec"]["elasticPolicy"]
    assert (policy["rdzvBackend"], policy["minReplicas"] < policy["maxReplicas"]) == ("c10d", True)
    (container,) = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert container["command"][:4] == ["torchrun", "-m", "project", "fit"]
    assert container["command"][-2:] == ["--resume", "auto"]
    for config in [b for a, b in zip(container["command"], container["command"][1:]) if a == "--config"]:
        assert (REPO / config).is_file(), config


def test_the_checkpoint_dump_a_survivor_writes_alone_is_still_lightnings_connector_method():
    # The resilience layer's dump_checkpoint: the dump of trainer.save_checkpoint without its write and barrier.
    import lightning as L

    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert callable(trainer._checkpoint_connector.dump_checkpoint)
    assert "weights_only" in inspect.signature(trainer._checkpoint_connector.dump_checkpoint).parameters


def test_a_survivors_checkpoint_counts_its_last_batch_as_lightning_does_when_it_saves_at_batch_end():
    done = {"ready": 11, "started": 11, "processed": 10, "completed": 10}
    loops = {"epoch_loop.batch_progress": {"total": dict(done), "current": dict(done), "is_last_batch": False},
             "epoch_loop.state_dict": {"_batches_that_stepped": 10}}  # fmt: skip
    fixed = as_saved_at_batch_end({"loops": {"fit_loop": loops}})["loops"]["fit_loop"]
    assert fixed["epoch_loop.batch_progress"]["total"] == {"ready": 10, "started": 10, "processed": 10, "completed": 9}
    assert fixed["epoch_loop.state_dict"]["_batches_that_stepped"] == 9  # the restart counts the batch: 10
