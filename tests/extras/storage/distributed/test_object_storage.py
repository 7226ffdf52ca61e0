"""A run directory in object storage, end to end: nodes that share no disk, kills, empty disks, one training per run.

A real S3-compatible server (moto's, on 127.0.0.1) stands for S3/MinIO; each "node" runs in a folder of its own
that the other never sees, so the store is the only thing they share. Runs are killed with SIGKILL (mid-run, or in
the middle of an upload), their folders wiped, and the same command with ``--resume auto`` must continue from the
store to the uninterrupted run's weights.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from storage_server import FAKE_KEY_ID, FAKE_SECRET, s3_server

from helpers import CPU_DDP, FAST, cli_env, every_10_steps, free_port, has_layer, run_cli

TORCHRUN = ("-m", "torch.distributed.run")
STEPS = every_10_steps()
SHORT = ["--config", FAST, "--trainer.max_epochs", "3", "--trainer.limit_val_batches", "2", "--test_after_fit", "false"]
ONE = ["fit", "--config", STEPS, *SHORT, "--trainer.max_steps", "40"]
# Two "nodes" of one process each: 9 steps per epoch, last.ckpt every 10 steps and at each epoch end.
TWO = ["fit", "--config", STEPS, *SHORT, "--config", CPU_DDP, "--trainer.max_steps", "25"]
ONE_EACH = ["--parallel.devices", "1"]
# The faults' module as a CLI subprocess imports it: tests/ is on its PYTHONPATH, this layer's folder is not.
FAULTS = "extras.storage.storage_faults"


def callback(class_path: str, **init_args) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": class_path, "init_args": init_args})


def at(url: str) -> list[str]:
    return ["--trainer.logger.init_args.save_dir", url]


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        yield server


def store_checkpoint(s3, run: str, name: str = "last.ckpt") -> dict:
    """The committed checkpoint ``name`` of a run in the store, read the way a reader does: its commit first."""
    fs = s3.fs()
    record = json.loads(fs.cat_file(f"{run}/checkpoints/{name}.commit"))
    return torch.load(io.BytesIO(fs.cat_file(f"{run}/checkpoints/{record['data']}")), weights_only=True)


def assert_close_weights(got: dict, want: dict, atol: float) -> None:
    assert got["global_step"] == want["global_step"]
    for key, value in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][key], value, atol=atol, rtol=0.0, msg=key)


def two_nodes(args: list[str], folders: list[Path], env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """``torchrun --nnodes 2`` (one process each), each agent in its own folder; both waited for."""
    rendezvous = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d", "--max-restarts", "0"]
    rendezvous += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", f"store-{time.time_ns()}"]
    agents = [
        subprocess.Popen(
            [sys.executable, *TORCHRUN, *rendezvous, "-m", "project", *args],
            cwd=folder,
            env=cli_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for folder in folders
    ]
    outputs = [agent.communicate(timeout=300) for agent in agents]
    return [subprocess.CompletedProcess(a.args, a.returncode, out, err) for a, (out, err) in zip(agents, outputs)]


def two_new_nodes(s3, tmp_path_factory, label: str, args: list[str]) -> None:
    """``args`` run on two "nodes" in new folders of their own; both must succeed."""
    nodes = [tmp_path_factory.mktemp(f"{label}_node{index}") for index in range(2)]
    for result in two_nodes(args, nodes, s3.env):
        assert result.returncode == 0, result.stderr[-3000:]


def wipe(*folders: Path) -> None:
    """A new allocation: nothing of the previous one on any node's disk."""
    for folder in folders:
        shutil.rmtree(folder)
        folder.mkdir()


def assert_no_credentials(s3, *folders: Path) -> None:
    fs = s3.fs()
    blobs = {path: fs.cat_file(path) for path in fs.find("runs")}
    blobs |= {str(p): p.read_bytes() for folder in folders for p in folder.rglob("*") if p.is_file()}
    assert blobs
    for path, data in blobs.items():
        assert FAKE_SECRET.encode() not in data and FAKE_KEY_ID.encode() not in data, path


@pytest.fixture(scope="module")
def uninterrupted_two(s3, tmp_path_factory) -> dict:
    """The same 2-node command left alone (same launcher, same threads per process): what the resume must end at."""
    two_new_nodes(s3, tmp_path_factory, "uninterrupted", [*TWO, *ONE_EACH, *at("s3://runs/reference")])
    return store_checkpoint(s3, "runs/reference/digits/version_0")


def test_two_nodes_without_a_shared_disk_killed_wiped_and_resumed_from_the_store(s3, tmp_path, uninterrupted_two):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    args = [*TWO, *ONE_EACH, *at("s3://runs/ddp")]
    killed = two_nodes([*args, callback("faults.KillAtStep", step=15, rank=0)], nodes, s3.env)
    assert killed[0].returncode != 0 and killed[1].returncode != 0
    run = "runs/ddp/digits/version_0"
    assert store_checkpoint(s3, run)["global_step"] == 10  # the last commit before the kill
    wipe(*nodes)
    resumed = two_nodes([*args, "--resume", "auto"], nodes, s3.env)
    for result in resumed:
        assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from" in resumed[0].stderr and "step 10" in resumed[0].stderr
    assert_close_weights(store_checkpoint(s3, run), uninterrupted_two, atol=1e-6)
    names = {path.rsplit("/", 1)[1] for path in s3.fs().find(run)}
    assert {"config.yaml", "plan.json", "hparams.yaml"} <= names
    assert any(name.startswith("events.out.tfevents.") for name in names)
    assert not (nodes[1] / ".scratch/s3/runs/ddp/digits/version_0/config.yaml").exists()  # rank 0's node only
    config = s3.fs().cat_file(f"{run}/config.yaml").decode()
    assert "save_dir: s3://runs/ddp" in config
    assert_no_credentials(s3, *nodes)


@pytest.fixture(scope="module")
def uninterrupted_one(tmp_path_factory) -> dict:
    cwd = tmp_path_factory.mktemp("uninterrupted_one")
    result = run_cli(ONE, cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(cwd / "logs/digits/version_0/checkpoints/last.ckpt", weights_only=True)


def test_a_kill_in_the_middle_of_an_upload_leaves_the_previous_commit_chosen(s3, tmp_path, uninterrupted_one):
    args = [*ONE, *at("s3://runs/upload")]
    killed = run_cli([*args, callback(f"{FAULTS}.KillDuringUpload", step=30)], tmp_path, env=s3.env)
    assert killed.returncode == -9, killed.stderr[-3000:]
    run, fs = "runs/upload/digits/version_0", s3.fs()
    data = fs.ls(f"{run}/checkpoints/.data", detail=False)
    # Step 30's data is up, its commit is not: last.ckpt is step 20's (mid-epoch: Lightning resumes exactly from
    # there, not from an epoch's last step with max_steps set; docs/checkpoints.md), beside the best of step 19.
    assert store_checkpoint(s3, run)["global_step"] == 20
    assert len(data) == 3
    wipe(tmp_path)
    resumed = run_cli([*args, "--resume", "auto"], tmp_path, env=s3.env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from" in resumed.stderr and "step 20" in resumed.stderr
    assert_close_weights(store_checkpoint(s3, run), uninterrupted_one, atol=1e-6)
    assert not set(data) & set(fs.ls(f"{run}/checkpoints/.data", detail=False))  # leftovers cleaned, by the holder


def test_a_second_training_of_the_run_is_refused_while_its_lease_is_held(s3, tmp_path):
    args = ["fit", "--config", STEPS, *SHORT, *at("s3://runs/lease")]
    first = run_cli([*args, "--trainer.max_steps", "10"], tmp_path, env=s3.env)
    assert first.returncode == 0, first.stderr[-3000:]
    run, fs = "runs/lease/digits/version_0", s3.fs()
    lease = {"host": "node-7", "pid": 4242, "since": "earlier", "token": "x", "expires": time.time() + 600}
    fs.pipe_file(f"{run}/.training.lease", json.dumps(lease).encode())
    before = {path: fs.info(path)["ETag"] for path in fs.find("runs/lease")}
    again = [*args, "--trainer.max_steps", "15", "--resume", "auto"]
    refused = run_cli(again, tmp_path, env=s3.env)
    assert refused.returncode == 2, refused.stderr[-3000:]
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert "s3://runs/lease/digits/version_0 is training already (pid 4242 on host node-7" in line
    assert {path: fs.info(path)["ETag"] for path in fs.find("runs/lease")} == before  # nothing written
    # Its holder stopped renewing it (a node lost): the lease expires, and the same command then trains.
    fs.pipe_file(f"{run}/.training.lease", json.dumps({**lease, "expires": time.time() - 1}).encode())
    allowed = run_cli(again, tmp_path, env=s3.env)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert store_checkpoint(s3, run)["global_step"] == 15
    assert not fs.exists(f"{run}/.training.lease")  # given back at the end


#: fsdp and consolidate are the sharding layer's.
SHARDING = pytest.mark.skipif(not has_layer("sharding"), reason="the sharding layer is stripped")
FSDP = ["--parallel.scenario", "fsdp", "--parallel.backend", "gloo", "--parallel.timeout_s", "120"]
TWO_FSDP = ["fit", "--config", STEPS, *SHORT, *FSDP, "--trainer.max_steps", "25"]


def consolidated(s3, url: str, out: Path) -> dict:
    """A sharded checkpoint of the store merged into one file by ``consolidate URL`` (what a user runs)."""
    result = subprocess.run(
        [sys.executable, "-m", "project", "consolidate", url, "--out", str(out)],
        cwd=out.parent,
        env=cli_env(s3.env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def uninterrupted_fsdp(s3, tmp_path_factory) -> dict:
    """The 2-node fsdp command left alone, its last checkpoint consolidated from the store."""
    two_new_nodes(s3, tmp_path_factory, "fsdp", [*TWO_FSDP, *ONE_EACH, *at("s3://runs/fsdp-reference")])
    url = "s3://runs/fsdp-reference/digits/version_0/checkpoints/last.ckpt"
    return consolidated(s3, url, tmp_path_factory.mktemp("fsdp_out") / "last.ckpt")


@SHARDING
def test_fsdp_on_two_nodes_killed_between_shard_uploads_and_commit_resumes_from_the_store(
    s3, tmp_path, uninterrupted_fsdp
):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    args = [*TWO_FSDP, *ONE_EACH, *at("s3://runs/fsdp")]
    # Rank 1 dies once its shards of the save of step 15 or later are up: rank 0 has not committed that save.
    killed = two_nodes([*args, callback(f"{FAULTS}.KillAfterOwnShards", step=15, rank=1)], nodes, s3.env)
    assert killed[0].returncode != 0 and killed[1].returncode != 0
    run, fs = "runs/fsdp/digits/version_0", s3.fs()
    commit = json.loads(fs.cat_file(f"{run}/checkpoints/last.ckpt.commit"))
    assert {"meta.pt", ".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(commit["files"])  # both ranks' shards
    named = {record.split("/")[1] for record in committed_data(fs, run)}
    orphans = [
        token for token in fs.ls(f"{run}/checkpoints/.data", detail=False) if token.rsplit("/", 1)[1] not in named
    ]
    assert any(fs.find(token) for token in orphans)  # the killed save's shards are up, and no commit names them
    wipe(*nodes)
    resumed = two_nodes([*args, "--resume", "auto"], nodes, s3.env)
    for result in resumed:
        assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from" in resumed[0].stderr and "step 10" in resumed[0].stderr, resumed[0].stderr[-3000:]
    got = consolidated(s3, f"s3://{run}/checkpoints/last.ckpt", tmp_path / "last.ckpt")
    assert_close_weights(got, uninterrupted_fsdp, atol=1e-6)
    assert not fs.exists(f"{run}/checkpoints/.data/{orphans[0].rsplit('/', 1)[1]}")  # cleaned by the lease holder
    assert not list((nodes[1] / ".scratch").rglob("*.tmp"))  # node 1's copy of each committed save dropped


@SHARDING
def test_a_sharded_checkpoints_url_validates_on_one_process_from_an_empty_folder(s3, tmp_path, uninterrupted_fsdp):
    # Written by 2 fsdp processes on 2 "nodes", read by 1 plain process (another world size) that never saw the run.
    url = "s3://runs/fsdp-reference/digits/version_0/checkpoints/last.ckpt"
    args = ["validate", "--config", STEPS, "--config", FAST, "--trainer.limit_val_batches", "2"]
    result = run_cli([*args, "--ckpt_path", url], tmp_path, env=s3.env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Loaded model weights from the checkpoint at .scratch/s3/runs/fsdp-reference/" in result.stderr
    (acc,) = [float(line.split("│")[2]) for line in result.stdout.splitlines() if "val/acc" in line]
    assert acc > 0.9  # the trained weights (an untrained network scores about 0.1)
    refused = run_cli([*args, "--ckpt_path", url.replace("last.ckpt", "gone.ckpt")], tmp_path, env=s3.env)
    assert refused.returncode == 2, refused.stderr[-3000:]
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert f"{url.replace('last.ckpt', 'gone.ckpt')} is not a committed checkpoint" in line


def committed_data(fs, run: str) -> list[str]:
    """The data paths (``.data/<token>/<name>``) the run's commit objects name."""
    commits = [path for path in fs.ls(f"{run}/checkpoints", detail=False) if path.endswith(".commit")]
    return [json.loads(fs.cat_file(path))["data"] for path in commits]


def test_storage_options_open_the_store_and_no_record_holds_their_credentials(s3, tmp_path):
    # The environment points at no store (a closed port, other keys): only the config's options reach moto.
    env = {**s3.env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    options = {"endpoint_url": s3.endpoint, "key": FAKE_KEY_ID, "secret": FAKE_SECRET}
    args = ["fit", "--config", STEPS, *SHORT, "--trainer.max_steps", "10", *at("s3://runs/options")]
    result = run_cli([*args, "--storage_options", json.dumps(options)], tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    run = "runs/options/digits/version_0"
    assert store_checkpoint(s3, run)["global_step"] == 10
    config = s3.fs().cat_file(f"{run}/config.yaml").decode()
    assert "key: <redacted>" in config and "secret: <redacted>" in config and s3.endpoint in config
    assert FAKE_SECRET not in result.stdout + result.stderr
    line = "Run directory: s3://runs/options/digits/version_0 (cache: .scratch/s3/runs/options/digits/version_0)"
    assert line in result.stdout.splitlines(), result.stdout[-2000:]
    assert_no_credentials(s3, tmp_path)


def test_a_preemption_stop_commits_its_step_to_the_store_before_the_process_exits(s3, tmp_path):
    args = ["fit", "--config", STEPS, *SHORT, "--trainer.max_steps", "30", *at("s3://runs/preempt")]
    stopped = run_cli([*args, callback("preempt_faults.SignalAtStep", step=13)], tmp_path, env=s3.env)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    run = "runs/preempt/digits/version_0"
    assert store_checkpoint(s3, run)["global_step"] == 13  # the stop's own save, committed before the exit
    assert not s3.fs().exists(f"{run}/.training.lease")  # given back: a new allocation may take it at once


def test_a_run_refused_before_its_first_step_leaves_nothing_in_the_store(s3, tmp_path):
    args = ["fit", "--config", STEPS, *SHORT, "--data.init_args.batch_size", "100000", *at("s3://runs/refused")]
    refused = run_cli(args, tmp_path, env=s3.env)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "one global batch of 100000" in refused.stderr
    assert s3.fs().find("runs/refused") == []  # its version's reservation given back, no lease, no record
    assert not [p for p in (tmp_path / ".scratch").rglob("*") if p.is_file()]
