"""What a sharded (fsdp) checkpoint save costs the training: written before returning, or in the background.

    python -m bench.extras.sharding.sharded_saves   # a table; --out FILE writes it too; --compare adds DCP's own ways

Two CPU processes over gloo (spawned here, no launcher) shard a stack of ``--layers`` Linear layers of
``--width`` with ``fully_shard`` (2048 x 6: 100 MB of weights) and take one AdamW step (its state: twice the
weights), then save what Lightning's checkpoint of them holds, ``--repeats`` times each way:

- **sync**: :func:`~project.extras.sharding.checkpoints.save.save_sharded` (``parallel.fsdp.async_save: false``):
  every rank writes its shards, DCP its ``.metadata``, rank 0 ``meta.pt`` and the swap onto the name; then it returns.
- **async**: :class:`~project.extras.sharding.checkpoints.asynchronous.AsyncShardedWriter` (the default): the call
  blocks while this rank's shards are copied into the kept staging buffers; "until written" is the call plus the
  wait for the background write (the training idle meanwhile). The training step time while a write runs, against
  an idle one, is what the write takes from the training on these cores.
- ``--compare``: DCP's ``async_save`` with its default stager (fresh buffers every save) and with its process
  executor (a second interpreter per rank; its first save, which starts it, is reported on its own).

Each time is the slower rank's (the ranks meet at the next collective), the median of the repeats.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from project.extras.sharding.checkpoints import save as sharded_save
from project.extras.sharding.checkpoints.asynchronous import AsyncShardedWriter

WORLD = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Job:
    """One rank's sharded network, its AdamW, and the checkpoint Lightning would save of them."""

    def __init__(self, width: int, layers: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (WORLD,))
        torch.manual_seed(0)
        self.net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
        for layer in self.net:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)
        self.optimizer = torch.optim.AdamW(self.net.parameters(), lr=1e-4)
        self.batch = torch.randn(8, width)
        self.steps = 0
        self.step()

    def step(self) -> None:
        """One training step (forward, backward with FSDP's reduce-scatter, AdamW)."""
        self.net(self.batch).square().mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.steps += 1

    def checkpoint(self) -> dict[str, Any]:
        """What ``ModelParallelStrategy`` hands ``save_checkpoint``: sharded weights and optimizer state."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(cpu_offload=True)
        return {
            "epoch": 0,
            "global_step": self.steps,
            "state_dict": get_model_state_dict(self.net, options=options),
            "optimizer_states": [get_optimizer_state_dict(self.net, self.optimizer, options=options)],
            "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 0}}}},
        }

    def shard_mb(self) -> float:
        """This rank's weights and optimizer state, in MB."""
        tensors = [p.to_local() for p in self.net.parameters()]
        tensors += [v.to_local() for s in self.optimizer.state.values() for v in s.values() if v.dim() > 0]
        return sum(t.numel() * t.element_size() for t in tensors) / 1e6


def _timed(begin: Callable[[], Any], finish: Callable[[], Any] = lambda: None) -> tuple[float, float]:
    """Seconds ``begin`` blocks, and until ``finish`` returned after it (the ranks start together)."""
    dist.barrier()
    start = time.perf_counter()
    begin()
    blocked = time.perf_counter() - start
    finish()
    return blocked, time.perf_counter() - start


def _measure(job: _Job, folder: Path, repeats: int, compare: bool) -> dict[str, list[float]]:
    """This rank's seconds per measurement (lists of repeats)."""
    found: dict[str, list[float]] = {}

    def note(key: str, seconds: float) -> None:
        found.setdefault(key, []).append(seconds)

    def target(name: str) -> tuple[Path, str]:
        shared = [uuid.uuid4().hex[:12]]
        dist.broadcast_object_list(shared, src=0)
        return folder / f"{name}.ckpt", shared[0]

    rank_zero = dist.get_rank() == 0
    for _ in range(repeats):
        path, token = target("sync")
        checkpoint = job.checkpoint()
        blocked, _ = _timed(lambda: sharded_save.save_sharded(checkpoint, path, token, rank_zero, dist.barrier))  # noqa: B023
        note("sync", blocked)

    writer = AsyncShardedWriter()
    writer.setup(None)
    for _ in range(repeats):
        path, token = target("async")
        checkpoint = job.checkpoint()
        blocked, written = _timed(lambda: writer.save(checkpoint, path, token), writer.wait)  # noqa: B023
        note("async_block", blocked)
        note("async_written", written)
    for _ in range(repeats):
        note("step_idle", _timed(job.step)[0])
        path, token = target("async")
        writer.save(job.checkpoint(), path, token)
        while True:  # the ranks step alike (a step is collective) while either still writes
            writing = torch.tensor([float(writer.in_flight)])
            dist.all_reduce(writing)
            if writing.item() == 0:
                break
            note("step_writing", _timed(job.step)[0])
        writer.wait()
    writer.teardown()

    if compare:
        _compare(job, folder, repeats, note, target)
    return found


def _compare(job: _Job, folder: Path, repeats: int, note: Any, target: Any) -> None:
    """DCP's own ``async_save`` (shards only): its default stager (fresh buffers), and its process executor."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    group = dist.new_group(backend="gloo")
    for kind, name in ((AsyncCheckpointerType.THREAD, "dcp_thread"), (AsyncCheckpointerType.PROCESS, "dcp_process")):
        first = kind is AsyncCheckpointerType.PROCESS  # its first save starts the process
        for _ in range(repeats + int(first)):
            path, token = target(name)
            shards, _ = sharded_save.split(job.checkpoint())
            writer = sharded_save.shard_writer(sharded_save.partial_name(path, token))
            options = {"storage_writer": writer, "planner": sharded_save.shard_planner(), "process_group": group}
            started: list[Any] = []
            blocked, written = _timed(
                lambda: started.append(dcp.async_save(shards, async_checkpointer_type=kind, **options)),  # noqa: B023
                lambda: started[0].result(),  # noqa: B023
            )
            key = f"{name}_first" if first else name
            note(f"{key}_block", blocked)
            note(f"{key}_written", written)
            first = False


def _rank(rank: int, port: int, folder: str, args: argparse.Namespace, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)  # as every bench run: one core per process
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        job = _Job(args.width, args.layers)
        found = _measure(job, Path(folder), args.repeats, args.compare)
        everyone: list[Any] = [None] * WORLD
        dist.all_gather_object(everyone, (found, job.shard_mb()))
        if rank == 0:
            results.put(everyone)
    finally:
        dist.destroy_process_group()


def _slowest(everyone: list[tuple[dict[str, list[float]], float]], key: str) -> float | None:
    """The median over repeats of the slower rank's seconds, in ms (``None``: not measured)."""
    if key not in everyone[0][0]:
        return None
    per_repeat = [max(values) for values in zip(*(found[key] for found, _ in everyone))]
    return statistics.median(per_repeat) * 1e3


def table(everyone: list[tuple[dict[str, list[float]], float]], args: argparse.Namespace) -> str:
    """The markdown table of the measurements."""
    ms = {key: _slowest(everyone, key) for key in everyone[0][0]}
    mb = everyone[0][1]
    sync = ms["sync"] or 0.0
    lines = [
        f"Sharded save of {args.layers} x Linear({args.width}) + AdamW on {WORLD} CPU processes (gloo): "
        f"{mb:.0f} MB per rank, median of {args.repeats}.",
        "",
        "| way | blocks the training | until written | blocking vs sync |",
        "| --- | ---: | ---: | ---: |",
        f"| sync (`parallel.fsdp.async_save: false`) | {sync:.0f} ms | {sync:.0f} ms | 100 % |",
    ]

    def row(title: str, block: str, written: str) -> None:
        if ms.get(block) is not None:
            lines.append(
                f"| {title} | {ms[block]:.0f} ms | {ms[written]:.0f} ms | {100 * ms[block] / sync:.0f} % |"  # type: ignore[operator]
            )

    row("async (default: thread, staging buffers kept)", "async_block", "async_written")
    row("DCP async_save, fresh staging buffers each save", "dcp_thread_block", "dcp_thread_written")
    row("DCP async_save, process executor", "dcp_process_block", "dcp_process_written")
    row("DCP async_save, process executor: its first save", "dcp_process_first_block", "dcp_process_first_written")
    if ms.get("step_writing") is not None:
        lines += [
            "",
            f"Training step: {ms['step_idle']:.0f} ms idle, {ms['step_writing']:.0f} ms while a background write "
            f"runs ({os.cpu_count()} cores for {WORLD} processes and their writer threads).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    prog = "python -m bench.extras.sharding.sharded_saves"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compare", action="store_true", help="also DCP's default stager and its process executor")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    # On the same disk as the runs (the current folder), as bench.saves.
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as folder:
        mp.spawn(_rank, args=(_free_port(), folder, args, results), nprocs=WORLD)
    text = table(results.get(), args)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
