"""What a checkpoint save costs the training thread: written in place (atomic, fsynced) or in the background.

    python -m bench.saves          # prints a table; --out FILE writes it too

For each workload's network and SGD-with-momentum state (what the bench trains), it times ``save_checkpoint``
on the calling thread with :class:`~project.checkpoints.io.AtomicCheckpointIO` (serialise, write, fsync,
rename, then return) and with :class:`~project.checkpoints.background.BackgroundCheckpointIO` (copy the
tensors, hand them to the writer thread, return), and how long the background write then takes. The
median of ``--repeats`` saves, each of a fresh state, into a temporary folder on the same disk as the runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.raw import network
from bench.tasks import default_rows
from bench.workloads import MID, SMALL, Workload
from project.checkpoints.background import BackgroundCheckpointIO
from project.checkpoints.io import AtomicCheckpointIO


def checkpoint_of(workload: Workload) -> dict:
    """A checkpoint shaped like Lightning's for the workload: weights, optimizer state, counters."""
    net, _ = network(workload.task, workload.in_features, workload.hidden)
    optimizer = torch.optim.SGD(net.parameters(), lr=workload.lr, momentum=workload.momentum)
    for param in net.parameters():
        param.grad = torch.randn_like(param)
    optimizer.step()  # creates the momentum buffers
    return {
        "epoch": 0,
        "global_step": workload.steps,
        "state_dict": net.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 0}}}},
    }


def time_saves(workload: Workload, folder: Path, repeats: int) -> dict[str, float]:
    """Median milliseconds: in place, background (calling thread), background (until written); and the MB."""
    in_place, handed, written = [], [], []
    atomic, background = AtomicCheckpointIO(), BackgroundCheckpointIO()
    size = 0.0
    for _ in range(repeats):
        checkpoint = checkpoint_of(workload)
        start = time.perf_counter()
        atomic.save_checkpoint(checkpoint, folder / "atomic.ckpt")
        in_place.append(time.perf_counter() - start)
        start = time.perf_counter()
        background.save_checkpoint(checkpoint, folder / "background.ckpt")
        handed.append(time.perf_counter() - start)
        background.wait()
        written.append(time.perf_counter() - start)
        size = (folder / "atomic.ckpt").stat().st_size / 1e6
    background.teardown()
    ms = {key: statistics.median(values) * 1e3 for key, values in (("in_place", in_place), ("handed", handed))}
    return {**ms, "written": statistics.median(written) * 1e3, "mb": size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.saves", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as every bench run
    lines = [
        "| checkpoint of | size | save in place (atomic, fsync) | background: training thread "
        "| background: until written |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as folder:
        for workload in (SMALL, MID, *(row.workload for row in default_rows(False, False))):
            found = time_saves(workload, Path(folder), args.repeats)
            lines.append(
                f"| {workload.title} | {found['mb']:.1f} MB | {found['in_place']:.1f} ms | {found['handed']:.2f} ms "
                f"| {found['written']:.1f} ms |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
