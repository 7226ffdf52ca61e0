"""What a checkpoint save costs the training when the run directory is in object storage, beside a local disk.

    python -m bench.extras.storage.store_saves  # prints a table; --size-mb, --repeats; --endpoint URL for a real store

One process saves a checkpoint of ``--size-mb`` MB of tensors (a Lightning-shaped dict) ``--repeats`` times with
the template's :class:`~project.checkpoints.background.BackgroundCheckpointIO`, into a local folder and into a
run directory given as ``s3://`` (moto's S3 server, in a process of its own on 127.0.0.1, unless ``--endpoint``
names another store, with its credentials from the environment), the two ways' saves interleaved. For each way
it reports what the save blocks the training (the call: a copy of the tensors), the training thread's CPU time
in it, and the time until the checkpoint is written, and in the store uploaded and committed (the call plus the
wait). Medians of the repeats, the load average, and the ratios of the blocking times against the target (a
save to the store blocks at most 1.25x a local save's time). Each save waits for the previous one first, as in a
training whose saves are further apart than an upload takes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "extras" / "storage"))  # storage_server: moto


def checkpoint(size_mb: int) -> dict:
    """A checkpoint-shaped dict: weights and twice their size of optimizer state, ``size_mb`` MB in all."""
    count = size_mb * (1 << 20) // 4 // 3
    weights = {f"layer{i}.weight": torch.randn(count // 4) for i in range(4)}
    state = {i: {"exp_avg": w.clone(), "exp_avg_sq": w.clone()} for i, w in enumerate(weights.values())}
    return {"state_dict": weights, "optimizer_states": [{"state": state}], "global_step": 1, "loops": {}}


def save_once(writer: object, path: Path, data: dict) -> tuple[float, float, float]:
    """Seconds one save of ``data`` blocks the caller, the caller's CPU time in it, and until it is written.

    The CPU time is the work the save does on the training thread, which the load of a shared machine does not
    stretch as it stretches the wall time; "written" is in a store also uploaded and committed.
    """
    start, cpu = time.perf_counter(), time.thread_time()
    writer.save_checkpoint(data, path)
    blocking, cpu = time.perf_counter() - start, time.thread_time() - cpu
    writer.wait()
    return blocking, cpu, time.perf_counter() - start


def measure(folders: dict[str, Path], data: dict, repeats: int) -> dict[str, tuple[float, ...]]:
    """Median (blocking, its CPU time, until written) seconds per way, the ways' saves interleaved.

    Interleaved (alternating which goes first) so that both ways see the same load on a shared machine:
    measured one after the other, a change of load between them reads as a difference of the ways.
    """
    from project.checkpoints.background import BackgroundCheckpointIO

    writers = {name: BackgroundCheckpointIO() for name in folders}
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in folders}
    for repeat in range(repeats + 1):  # the first round warms both up (allocations, connections) and is dropped
        order = list(folders) if repeat % 2 == 0 else list(reversed(folders))
        for name in order:
            timing = save_once(writers[name], folders[name] / "checkpoints" / "last.ckpt", data)
            if repeat > 0:
                times[name].append(timing)
    for writer in writers.values():
        writer.teardown()
    return {name: tuple(statistics.median(t[i] for t in got) for i in range(3)) for name, got in times.items()}


@contextlib.contextmanager
def store_env(endpoint: str | None, bucket: str):
    """The endpoint given, or moto's server started on 127.0.0.1 in a process of its own for the bench.

    Its own process, as a real store is elsewhere: moto's server in this process would hold the interpreter's
    lock in its threads while the training thread copies the tensors, which a real store never does.
    """
    if endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        yield
        return
    import s3fs
    from storage_server import FAKE_KEY_ID, FAKE_SECRET, environment

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": FAKE_KEY_ID, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET}
    try:
        for _ in range(300):  # its start-up: imports, then the port answers
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        s3fs.S3FileSystem(key=FAKE_KEY_ID, secret=FAKE_SECRET, endpoint_url=url).mkdir(bucket)
        with environment({**env, "AWS_DEFAULT_REGION": "us-east-1"}):
            yield
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    """Run the comparison and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--endpoint", default=None, help="an S3-compatible endpoint (default: moto on 127.0.0.1)")
    parser.add_argument("--bucket", default="bench")
    args = parser.parse_args()
    from project.extras.storage import location

    data = checkpoint(args.size_mb)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[location.SCRATCH_ENV] = str(Path(tmp) / "scratch")
        with store_env(args.endpoint, args.bucket):
            store = location.attach(f"s3://{args.bucket}/bench-{os.getpid()}")
            folders = {"local folder": Path(tmp) / "local" / "version_0", "s3:// (store)": store.scratch / "version_0"}
            result = measure(folders, data, args.repeats)
    load_after = os.getloadavg()
    print(
        f"{args.size_mb} MB checkpoint, medians of {args.repeats} interleaved saves, {os.cpu_count()} cores, "
        f"load average {load_before[0]:.1f} before and {load_after[0]:.1f} after"
    )
    print("| where | blocks the training | its CPU time | until written (and committed) |")
    print("| --- | ---: | ---: | ---: |")
    for name, (blocking, cpu, written) in result.items():
        print(f"| {name} | {blocking * 1000:.0f} ms | {cpu * 1000:.0f} ms | {written * 1000:.0f} ms |")
    for what, i in (("wall", 0), ("CPU", 1)):
        ratio = result["s3:// (store)"][i] / result["local folder"][i]
        verdict = "within" if ratio <= 1.25 else "over"
        print(f"a save to the store blocks {ratio:.2f}x a local save's {what} time ({verdict} the 1.25x target)")


if __name__ == "__main__":
    main()
