"""The raw PyTorch loop, written the way the seed writes it: one process, or DDP under torchrun.

    python bench/raw.py --data train.pt --steps 2000                           # one process
    torchrun --standalone --nproc-per-node 2 bench/raw.py --data train.pt ...   # DDP, gloo on CPU

It trains the template's own network (``DigitsNet`` with cross-entropy; ``--task NAME``: a layer's task, see
``bench/tasks.py``, e.g. the regression MLP with MSE or the GPT on windows of text) on the same
tensors in the same order as the template (``GlobalBatchSampler`` is a
``DistributedSampler`` whose global batches do not depend on the world size), so its final loss can be
compared with the Lightning runs. No Lightning import.
"""

import argparse
import contextlib
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

# Run as a script (`python bench/raw.py`, as torchrun does): make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import StepClock, weights_checksum, write_record
from bench.tasks import task as task_of
from bench.tasks import tasks
from project.models.digits_net import DigitsNet
from project.parallel.samplers import GlobalBatchSampler


def synchronize():
    """The seed's barrier: only when distributed is available, initialised and has > 1 process."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    dist.barrier()


def network(name, in_features, hidden, block_size=0):
    """The network and loss of the task: what the template's Classifier or a layer's module computes."""
    if (extra := task_of(name)) is not None:
        return extra.network(hidden, block_size, in_features)
    return DigitsNet(in_features=in_features, hidden=hidden, dropout=0.0, batch_norm=True), F.cross_entropy


def training_set(name, data, block_size):
    """The dataset of the harness's file and its collate_fn: tensors {x, y}, or a layer's task's (text {tokens})."""
    if (extra := task_of(name)) is not None:
        return extra.training_set(data, block_size)
    return TensorDataset(data["x"], data["y"]), None


def optimizer_of(name, parameters, lr, momentum):
    """SGD with momentum, or AdamW with its defaults but the learning rate."""
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr)
    return torch.optim.SGD(parameters, lr=lr, momentum=momentum)


def parse_args():
    parser = argparse.ArgumentParser(description="Raw PyTorch training loop (the seed's recipe).")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--data", required=True, help="torch.save'd {'x', 'y'} tensors ({'tokens'}: a text task)")
    parser.add_argument("--task", choices=("classification", *tasks()), default="classification")
    parser.add_argument("--block-size", type=int, default=0, help="tokens per sample (a text task)")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100, help="steps left out of the throughput")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42, help="model initialisation")
    parser.add_argument("--data-seed", type=int, default=0, help="shuffling")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    return parser.parse_args()


def main():
    args = parse_args()
    # WORLD_SIZE is set by the launcher: nproc_per_node x nodes.
    num_procs = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else 1
    is_distributed = num_procs > 1
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{args.local_rank}")
    if is_distributed:
        if device.type == "cuda":
            torch.cuda.set_device(args.local_rank)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", init_method="env://")
        synchronize()
    rank = dist.get_rank() if is_distributed else 0

    data = torch.load(args.data, weights_only=True)
    dataset, collate = training_set(args.task, data, args.block_size)
    sampler = GlobalBatchSampler(dataset, args.batch_size, num_replicas=num_procs, rank=rank, seed=args.data_seed)
    loader = DataLoader(dataset, args.batch_size, sampler=sampler, pin_memory=device.type == "cuda", collate_fn=collate)

    torch.manual_seed(args.seed)
    model, loss_fn = network(args.task, data["x"].shape[1] if "x" in data else 0, args.hidden, args.block_size)
    model = model.to(device)
    if is_distributed:
        ids = [args.local_rank] if device.type == "cuda" else None
        # The seed's flags; torch 2.13 warns that broadcast_buffers is now called forward_sync_buffers.
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=ids, output_device=ids[0] if ids else None, broadcast_buffers=False
        )
    optimizer = optimizer_of(args.optimizer, model.parameters(), args.lr, args.momentum)

    clock = StepClock(args.warmup, args.steps, torch.cuda.synchronize if device.type == "cuda" else None)
    mixed = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    model.train()
    step = 0
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with mixed:
                loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            clock.tick()
            step += 1
            if step == args.steps:
                break
        sampler.set_epoch(sampler.epoch + 1)

    # At test time: model = model.module
    net = model.module if is_distributed else model
    if rank == 0:
        write_record(clock.record(loss.item(), weights_checksum(net), world_size=num_procs))
    synchronize()
    if is_distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
