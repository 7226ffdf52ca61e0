"""The raw pipeline-parallel loop, written from the torch.distributed.pipelining docs: the reference of the PP rows.

    torchrun --standalone --nproc-per-node 2 bench/extras/gpt/raw_pipeline.py --data train.pt --schedule 1f1b \
        --microbatches 4

Every process builds the template's GPT (``project.extras.gpt.gpt``, seeded as the template seeds it) and keeps its
stage the torchtitan way: the other stage's modules are dropped and the kept ones keep their names
(``tok_emb``, ``blocks.2``, ``lm_head``), so a stage's state dict is a slice of the whole model's. The stages
run under ``PipelineStage`` and ``Schedule1F1B`` (or ``ScheduleGPipe``) over gloo, each with its own AdamW.
Every stage reads the same batches in the same order as the template (``GlobalBatchSampler`` with one
data-parallel replica): the first feeds the tokens, the last the targets. No Lightning import.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.utils.data import DataLoader

# Run as a script (`torchrun bench/extras/gpt/raw_pipeline.py`): make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.extras.gpt import task
from bench.record import StepClock, write_record
from project.parallel.samplers import GlobalBatchSampler

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}


class GPTStage(nn.Module):
    """One pipeline stage of ``project.extras.gpt.gpt.GPT``: its slice of blocks, under the GPT's own names.

    The first stage keeps the embeddings, the last the final LayerNorm and the head; the blocks are split
    evenly (the first stages take one more when they do not divide). ``forward`` is the GPT's, cut at the stage.
    """

    def __init__(self, gpt: nn.Module, stage: int, stages: int) -> None:
        super().__init__()
        layers = len(gpt.blocks)
        first = stage * layers // stages
        last = (stage + 1) * layers // stages
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        self.tok_emb = gpt.tok_emb if self.is_first else None
        self.pos_emb = gpt.pos_emb if self.is_first else None
        self.drop = gpt.drop
        # A ModuleDict keyed by the block's index in the whole model: the names of a one-process checkpoint.
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in range(first, last)})
        self.ln_f = gpt.ln_f if self.is_last else None
        self.lm_head = gpt.lm_head if self.is_last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, T]`` (first stage) or activations ``[B, T, C]`` in; activations or logits out."""
        if self.tok_emb is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.tok_emb(x) + self.pos_emb(positions))
        for block in self.blocks.values():
            x = block(x)
        if self.lm_head is not None:
            x = self.lm_head(self.ln_f(x))
        return x


def parse_args() -> argparse.Namespace:
    """The workload's arguments (``bench.workloads.Workload.script_args``) and the pipeline's."""
    parser = argparse.ArgumentParser(description="Raw pipeline-parallel training loop (torch.distributed.pipelining).")
    parser.add_argument("--data", required=True, help="torch.save'd {'tokens'} training text")
    parser.add_argument("--task", choices=(task.TASK,), default=task.TASK)
    parser.add_argument("--block-size", type=int, default=128, help="characters per sample")
    parser.add_argument("--optimizer", choices=("adamw",), default="adamw")
    parser.add_argument("--hidden", type=int, default=128, help="the GPT's n_embd")
    parser.add_argument("--batch-size", type=int, default=32, help="per pipeline (one data-parallel replica)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=25, help="steps left out of the throughput")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--momentum", type=float, default=0.9, help="unused (AdamW)")
    parser.add_argument("--seed", type=int, default=42, help="model initialisation")
    parser.add_argument("--data-seed", type=int, default=0, help="shuffling")
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches each batch is cut into")
    return parser.parse_args()


def whole_model_sums(stage: nn.Module, loss: float) -> tuple[float, float]:
    """The final loss (the last stage's) and the sum of every parameter of the whole model, on every rank."""
    local = sum(p.detach().double().sum() for p in stage.parameters())
    is_last = dist.get_rank() == dist.get_world_size() - 1
    both = torch.tensor([loss if is_last else 0.0, float(local)], dtype=torch.float64)
    dist.all_reduce(both)  # each parameter lives on exactly one stage
    return float(both[0]), float(both[1])


def main() -> None:
    args = parse_args()
    dist.init_process_group(backend="gloo", init_method="env://")
    rank, stages = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")

    data = torch.load(args.data, weights_only=True)
    dataset, collate = task.training_set(data, args.block_size)
    # One pipeline: every stage reads the whole batch (the first uses the tokens, the last the targets).
    sampler = GlobalBatchSampler(dataset, args.batch_size, num_replicas=1, rank=0, seed=args.data_seed)
    loader = DataLoader(dataset, args.batch_size, sampler=sampler, collate_fn=collate)

    torch.manual_seed(args.seed)  # the whole model on every rank, as one process would build it, then cut
    gpt, loss_fn = task.network(args.hidden, args.block_size)
    model = GPTStage(gpt, rank, stages).to(device)
    del gpt
    stage = PipelineStage(model, rank, stages, device)
    schedule = SCHEDULES[args.schedule](stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    clock = StepClock(args.warmup, args.steps)
    model.train()
    step, losses = 0, []
    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            losses = []
            if model.is_first:
                schedule.step(x)
            elif model.is_last:
                schedule.step(target=y, losses=losses)
            else:
                schedule.step()
            optimizer.step()
            clock.tick()
            step += 1
            if step == args.steps:
                break
        sampler.set_epoch(sampler.epoch + 1)

    last_loss = float(torch.stack(losses).detach().mean()) if losses else 0.0  # the mean of the micro-batches' means
    loss, checksum = whole_model_sums(model, last_loss)
    if rank == 0:
        write_record(clock.record(loss, checksum, world_size=stages, stages=stages, schedule=args.schedule))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
