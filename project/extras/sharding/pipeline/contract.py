"""What a LightningModule gives a pipeline: its network, its batches ``(input, target)`` and its loss.

The contract (docs/parallel.md, "Pipeline parallelism"):

- the network the stages are cut from is the module's ``net`` (or ``model``/``network``) attribute, an
  ``nn.Module`` whose forward runs with the other stages' units replaced by ``nn.Identity`` (an ``nn.Sequential``
  does; the template's GPT does);
- a training batch is ``(input, target)``: ``input`` goes into the network, ``target`` to the loss;
- ``pipeline_loss(output, target)`` is the mean loss of one micro-batch (the last stage calls it).

A module that does not meet it is refused in one line naming what is missing, before anything runs.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from project.errors import UserError
from project.extras.sharding.plan.pipeline_plan import network_of, plan_stages


def check_contract(module: Any, stages: int) -> str:
    """The name of ``module``'s network attribute, after checking the whole contract.

    Raises:
        UserError: no network attribute, or no ``pipeline_loss`` method.
    """
    found = network_of(module)
    if found is None:
        plan_stages(module, stages)  # its one-line refusal
    if not callable(getattr(module, "pipeline_loss", None)):
        raise UserError(
            f"parallel.pipeline_parallel.size={stages}: {type(module).__name__} has no pipeline_loss(output, target) "
            "method (the last stage's mean loss of one micro-batch); add it or set parallel.pipeline_parallel.size 1"
        )
    assert found is not None
    return found[0]


def split_batch(batch: Any, kind: str) -> tuple[Tensor, Tensor]:
    """A training batch as ``(input, target)``.

    Raises:
        UserError: a batch that is not a pair of tensors.
    """
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, Tensor) for t in batch):
        return batch[0], batch[1]
    raise UserError(
        f"parallel.pipeline_parallel: {kind}'s training batches are {type(batch).__name__}, not (input, target) "
        "tensors; return (input, target) pairs from the training loader"
    )


def refuse_loop_features(trainer: Any, stages: int) -> None:
    """What Lightning's loop would do wrong around a schedule: accumulation, clipping, manual optimization."""
    size = f"parallel.pipeline_parallel.size={stages}"
    if trainer.accumulate_grad_batches != 1:
        raise UserError(
            f"{size} with gradient accumulation {trainer.accumulate_grad_batches}: the schedule's micro-batches "
            "are the accumulation; set parallel.pipeline_parallel.microbatches instead and accumulation 1"
        )
    if trainer.gradient_clip_val:
        raise UserError(
            f"{size} with trainer.gradient_clip_val={trainer.gradient_clip_val}: each stage would clip its own "
            "part of the norm; drop gradient clipping or set parallel.pipeline_parallel.size 1"
        )
    if not trainer.lightning_module.automatic_optimization:
        raise UserError(f"{size}: manual optimization drives its own backward; use automatic optimization")
