"""What a checkpoint save costs the training when the run directory is in object storage, beside a local disk.

    python -m bench.store_saves            # prints a table; --size-mb, --repeats; --endpoint URL for a real store

One process saves a checkpoint of ``--size-mb`` MB of tensors (a Lightning-shaped dict) ``--repeats`` times with
the template's :class:`~project.checkpoints.background.BackgroundCheckpointIO`, into a local folder and into a
run directory given as ``s3://`` (moto's S3 server on 127.0.0.1 unless ``--endpoint`` names another, with its
credentials from the environment). For each way it reports what the save blocks the training (the call: a copy
of the tensors) and the time until the checkpoint is written, and in the store uploaded and committed (the
call plus the wait). Medians of the repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # storage_server, the tests' moto server


def checkpoint(size_mb: int) -> dict:
    """A checkpoint-shaped dict: weights and twice their size of optimizer state, ``size_mb`` MB in all."""
    count = size_mb * (1 << 20) // 4 // 3
    weights = {f"layer{i}.weight": torch.randn(count // 4) for i in range(4)}
    state = {i: {"exp_avg": w.clone(), "exp_avg_sq": w.clone()} for i, w in enumerate(weights.values())}
    return {"state_dict": weights, "optimizer_states": [{"state": state}], "global_step": 1, "loops": {}}


def measure(folder: Path, data: dict, repeats: int) -> tuple[float, float]:
    """Median (blocking, until written) seconds of ``repeats`` saves of ``data`` into ``folder``."""
    from project.checkpoints.background import BackgroundCheckpointIO

    writer = BackgroundCheckpointIO()
    blocking, written = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        writer.save_checkpoint(data, folder / "checkpoints" / "last.ckpt")
        blocking.append(time.perf_counter() - start)
        writer.wait()
        written.append(time.perf_counter() - start)
    writer.teardown()
    return statistics.median(blocking), statistics.median(written)


@contextlib.contextmanager
def store_env(endpoint: str | None):
    """The endpoint given, or moto's server on 127.0.0.1 for the run of the bench."""
    if endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        yield
        return
    from storage_server import environment, s3_server

    with s3_server("bench") as server, environment(server.env):
        yield


def main() -> None:
    """Run the comparison and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--endpoint", default=None, help="an S3-compatible endpoint (default: moto on 127.0.0.1)")
    parser.add_argument("--bucket", default="bench")
    args = parser.parse_args()
    from project.storage import location

    data = checkpoint(args.size_mb)
    with tempfile.TemporaryDirectory() as tmp:
        local = measure(Path(tmp) / "local" / "version_0", data, args.repeats)
        os.environ[location.SCRATCH_ENV] = str(Path(tmp) / "scratch")
        with store_env(args.endpoint):
            store = location.attach(f"s3://{args.bucket}/bench-{os.getpid()}")
            remote = measure(store.scratch / "version_0", data, args.repeats)
    print(f"{args.size_mb} MB checkpoint, medians of {args.repeats}, {os.cpu_count()} cores")
    print("| where | blocks the training | until written (and committed) |")
    print("| --- | ---: | ---: |")
    for name, (blocking, written) in (("local folder", local), ("s3:// (store)", remote)):
        print(f"| {name} | {blocking * 1000:.0f} ms | {written * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
