"""Commit-then-point against a real S3-compatible server (moto's, on 127.0.0.1): what readers choose, whatever a kill.

A checkpoint's data goes up under a fresh token, then one small commit object names it; these tests build the
store's state a kill leaves at each point of an upload and check what ``--resume auto``'s pull brings back.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from storage_server import attached_store, environment, s3_server

from project.checkpoints.loading import safe_load
from project.extras.storage import commits, location, objects, pull, records
from project.extras.storage.run import reserve_version, unreserve


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server, environment(server.env):
        yield server


@pytest.fixture
def store(s3, tmp_path):
    with attached_store(str(tmp_path / "scratch")) as attached:
        yield attached


def save(path: Path, step: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step, "state_dict": {"w": torch.full((64,), float(step))}, "loops": {}}, path)
    return path


def sharded(folder: Path, step: int) -> Path:
    for rank in (0, 1):
        save(folder / f"__{rank}_0.distcp", step * 10 + rank)
    (folder / ".metadata").write_bytes(f"metadata {step}".encode())
    return folder


def wipe(store: location.Store) -> None:
    """A new allocation: the node's scratch cache is gone, the store is not."""
    import shutil

    shutil.rmtree(store.scratch, ignore_errors=True)
    pull._PULLED.clear()


def test_the_commit_is_what_a_reader_chooses_and_a_killed_upload_changes_nothing(store):
    last = store.scratch / "digits/version_0/checkpoints/last.ckpt"
    commits.upload(store, save(last, 10))
    remote = store.remote(last.parent)
    # The next save's data went up, its commit did not: the writer was killed between the two.
    save(last, 20)
    commits.upload_files(store, last, f"{remote}/{commits.DATA}/{commits.token()}/last.ckpt")
    wipe(store)
    run = pull.pull(store, store.scratch / "digits", None)
    assert run == store.scratch / "digits/version_0"
    assert safe_load(last)["global_step"] == 10
    assert pull.counts(last)
    # Only the run holding the lease cleans: the killed upload's data goes, the committed one stays.
    assert len(commits.clean_uncommitted(store, remote)) == 1
    assert len(objects.listing(store.fs, f"{remote}/{commits.DATA}")) == 1
    wipe(store)
    pull.pull(store, store.scratch / "digits", None)
    assert safe_load(last)["global_step"] == 10


def test_a_sharded_folder_killed_after_some_shards_leaves_the_previous_one_whole(store):
    folder = store.scratch / "digits/version_0/checkpoints/last.ckpt"
    commits.upload(store, sharded(folder, 1))
    remote = store.remote(folder)
    data = f"{remote.rsplit('/', 1)[0]}/{commits.DATA}/{commits.token()}/last.ckpt"
    sharded(folder, 2)
    objects.put(store.fs, folder / "__0_0.distcp", f"{data}/__0_0.distcp")  # one shard up, then the kill
    wipe(store)
    pull.pull(store, store.scratch / "digits", None)
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert safe_load(folder / "__1_0.distcp")["global_step"] == 11
    assert (folder / ".metadata").read_bytes() == b"metadata 1"


def test_the_cache_is_replaced_by_what_the_store_committed(store):
    last = store.scratch / "digits/version_0/checkpoints/last.ckpt"
    commits.upload(store, save(last, 10))
    save(last, 30)  # written on this node, never committed: not a record
    pull._PULLED.clear()
    pull.pull(store, store.scratch / "digits", None)
    assert safe_load(last)["global_step"] == 10
    stranger = save(last.with_name("epoch=9.ckpt"), 99)  # in the cache, not in the store: never chosen
    assert not pull.counts(stranger)


def test_a_damaged_or_missing_object_is_left_out_and_an_intact_checkpoint_is_chosen(store, capsys):
    checkpoints = store.scratch / "digits/version_0/checkpoints"
    intact = save(checkpoints / "epoch=0-step=5.ckpt", 5)
    commits.upload(store, intact)
    last = checkpoints / "last.ckpt"
    record = commits.upload(store, save(last, 10))
    best = save(checkpoints / "best.ckpt", 9)
    missing = commits.upload(store, best)
    remote = store.remote(checkpoints)
    store.fs.pipe_file(f"{remote}/{record['data']}", b"not the checkpoint")
    store.fs.rm_file(f"{remote}/{missing['data']}")
    wipe(store)
    pull.pull(store, store.scratch / "digits", None)
    said = capsys.readouterr().err
    assert "warning: the committed checkpoint last.ckpt of version_0 is left out" in said
    assert "not the object its commit names" in said and "best.ckpt of version_0 is left out" in said
    assert not last.exists() and not best.exists()
    assert safe_load(intact)["global_step"] == 5 and pull.counts(intact)


def test_the_newest_committed_run_is_pulled_and_a_withdrawn_checkpoint_is_gone(store):
    old = commits.upload(store, save(store.scratch / "digits/version_0/checkpoints/last.ckpt", 5))
    best = save(store.scratch / "digits/version_1/checkpoints/best.ckpt", 7)
    commits.upload(store, best)
    commits.upload(store, save(store.scratch / "digits/version_1/checkpoints/last.ckpt", 8))
    commits.withdraw(store, best)
    wipe(store)
    assert pull.pull(store, store.scratch / "digits", None) == store.scratch / "digits/version_1"
    assert [p.name for p in (store.scratch / "digits/version_1/checkpoints").iterdir()] == ["last.ckpt"]
    assert old["data"].startswith(f"{commits.DATA}/")
    remote = store.remote(store.scratch / "digits/version_1/checkpoints")
    assert len(objects.listing(store.fs, f"{remote}/{commits.DATA}")) == 1  # best's data went with its commit


def test_versions_are_reserved_in_the_store_not_by_one_node_listing(store):
    root = store.scratch / "digits"
    assert reserve_version(root, 0) == 0
    assert reserve_version(root, 0) == 1  # another node, whose cache is empty, gets the next one
    unreserve(root / "version_1")
    assert reserve_version(root, 0) == 1
    assert reserve_version(Path("logs/digits"), 0) is None  # a local run: the disk decides, as before


def test_records_go_up_with_the_url_and_without_hidden_files(store):
    run = store.scratch / "digits/version_0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"trainer:\n  logger:\n    init_args:\n      save_dir: {store.scratch}\n")
    (run / "plan.json").write_text("{}")
    (run / ".training.lock").write_text("x")
    sent = records.sync(store, run)
    assert sorted(s.rsplit("/", 1)[1] for s in sent) == ["config.yaml", "plan.json"]
    assert f"save_dir: {store.url}" in store.fs.cat_file(f"{store.remote(run)}/config.yaml").decode()
    assert records.sync(store, run) == []  # nothing changed: nothing goes up again


def test_a_file_url_is_the_same_layer(tmp_path, monkeypatch):
    monkeypatch.setenv(location.SCRATCH_ENV, str(tmp_path / "scratch"))
    store = location.attach(f"file://{tmp_path}/bucket/prefix")
    try:
        last = store.scratch / "digits/version_0/checkpoints/last.ckpt"
        commits.upload(store, save(last, 3))
        assert (tmp_path / "bucket/prefix/digits/version_0/checkpoints/last.ckpt.commit").is_file()
        wipe(store)
        pull.pull(store, store.scratch / "digits", None)
        assert safe_load(last)["global_step"] == 3 and os.path.getmtime(last) > 0
    finally:
        location.detach()
