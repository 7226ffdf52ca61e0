"""Whether the data position of the checkpoint a run resumes can continue: the same global batch and accumulation.

:class:`~project.callbacks.loader_guarantees.LoaderGuaranteesCallback` counts how far into the epoch training got
in global micro-batches, the same number at any world size; it means the same samples only while the global batch
and its accumulation stay those of the run that wrote the checkpoint.
"""

from __future__ import annotations

from typing import Any

from project.errors import UserError
from project.plan.resolve import Plan


def check_resumable(resuming: dict[str, Any] | None, plan: Plan | None) -> None:
    """A resumed run must keep the global batch and its accumulation: the position counts micro-batches.

    Args:
        resuming: The loader callback's state in the checkpoint the run starts from, if any.
        plan: The run's plan with the data batch size applied (``None`` while it is not known).

    Raises:
        UserError: the accumulation or the global batch differ from the checkpoint's (the message says how to
            resume).
    """
    saved = (resuming or {}).get("global_batch_size")
    saved_accumulation = (resuming or {}).get("accumulation", 1)
    # What the loader accumulates: where a layer splits whole steps itself (micro_batch auto), 1.
    accumulation = plan.loader_batches[1] if plan is not None else None
    if accumulation is not None and saved is not None and accumulation != saved_accumulation:
        fix = f"--parallel.accumulation {saved_accumulation}"
        raise UserError(
            f"the checkpoint was trained with an accumulation of {saved_accumulation} loader batches per step, "
            f"this run's would be {accumulation}: the data position could not continue; resume with {fix} and "
            f"--parallel.global_batch_size {saved}"
        )
    if saved is not None and plan is not None and plan.global_batch_size not in (None, saved):
        raise UserError(
            f"the checkpoint was trained with global batches of {saved} samples, this run's would be "
            f"{plan.global_batch_size} ({plan.per_device_batch_size} per process x {plan.layout.dp_size_name} "
            f"{plan.dp_size}): the "
            f"data order could not continue; resume with --parallel.global_batch_size {saved}, or start a "
            "new training from its weights with --model.init_args.weights"
        )
