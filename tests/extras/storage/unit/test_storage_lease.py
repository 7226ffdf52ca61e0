"""One training per run without fcntl: the lease object on a real S3-compatible server (moto's, on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import time

import pytest
from storage_server import attached_store, environment, s3_server

from project.errors import UserError
from project.extras.storage import lease, objects


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server, environment(server.env):
        yield server


@pytest.fixture
def run(s3, tmp_path):
    with attached_store(str(tmp_path / "scratch")) as store:
        yield store, store.scratch / "digits/version_0"


def held_by(store, run_dir, host: str, pid: int, expires_in: float) -> None:
    record = {"host": host, "pid": pid, "since": "then", "token": "theirs", "expires": time.time() + expires_in}
    objects.write(store.fs, f"{store.remote(run_dir)}/{lease.LEASE_NAME}", json.dumps(record).encode())


def test_a_second_training_is_refused_in_one_line_naming_the_holder(run):
    store, run_dir = run
    first = lease.Lease.take(store, run_dir)
    try:
        with pytest.raises(UserError) as refused:
            lease.Lease.take(store, run_dir)
        message = str(refused.value)
        assert "\n" not in message and "is training already" in message
        assert f"pid {first.record['pid']} on host {socket.gethostname()}" in message
    finally:
        first.release()
    lease.Lease.take(store, run_dir).release()  # released: the next one takes it


def test_a_lease_of_another_host_blocks_until_it_expires(run):
    store, run_dir = run
    held_by(store, run_dir, "node-7", 4242, expires_in=600)
    with pytest.raises(UserError, match=r"pid 4242 on host node-7, since then; its lease expires in"):
        lease.Lease.take(store, run_dir)
    held_by(store, run_dir, "node-7", 4242, expires_in=-1)  # no heartbeat came for its time to live
    taken = lease.Lease.take(store, run_dir)  # expired: taken over
    assert objects.read_json(store.fs, taken.remote)[0]["token"] == taken.record["token"]
    taken.release()
    assert objects.read_json(store.fs, taken.remote) == (None, None)


def test_a_lease_of_a_dead_process_of_this_host_is_free_at_once(run):
    store, run_dir = run
    held_by(store, run_dir, socket.gethostname(), 2**22 + 12345, expires_in=600)  # no such pid
    lease.Lease.take(store, run_dir).release()


def test_the_heartbeat_keeps_the_lease_past_its_time_to_live(run, monkeypatch):
    store, run_dir = run
    monkeypatch.setenv(lease.TTL_ENV, "3")  # a beat every second: a loaded machine may delay one by 2 s
    holder = lease.Lease.take(store, run_dir)
    try:
        time.sleep(6.0)  # twice the time to live: only the heartbeats keep it
        record, _ = objects.read_json(store.fs, holder.remote)
        assert record["token"] == holder.record["token"] and record["expires"] > time.time()
        with pytest.raises(UserError, match="is training already"):
            lease.Lease.take(store, run_dir)
    finally:
        holder.release()


def test_of_two_takers_of_an_expired_lease_one_wins(run):
    store, run_dir = run
    held_by(store, run_dir, "node-7", 4242, expires_in=-1)
    remote = f"{store.remote(run_dir)}/{lease.LEASE_NAME}"
    _, tag = objects.read_json(store.fs, remote)
    assert objects.replace(store.fs, remote, {"token": "a"}, tag) is not None
    assert objects.replace(store.fs, remote, {"token": "b"}, tag) is None  # If-Match on the old ETag fails


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1", "inf", "nan"])
def test_a_time_to_live_that_cannot_work_is_refused_in_one_line(monkeypatch, value):
    monkeypatch.setenv(lease.TTL_ENV, value)
    with pytest.raises(UserError, match=rf"PROJECT_LEASE_TTL_S='{value}': .* must be a number of seconds >= 3") as e:
        lease.ttl_s()
    assert "\n" not in str(e.value)


def test_a_time_to_live_of_a_few_heartbeats_is_taken(monkeypatch):
    monkeypatch.setenv(lease.TTL_ENV, "3")
    assert lease.ttl_s() == 3.0
    monkeypatch.delenv(lease.TTL_ENV)
    assert lease.ttl_s() == 60.0
