"""A resume keeps the data position only with the checkpoint's global batch and accumulation (it counts batches)."""

from __future__ import annotations

from typing import Any

from project.errors import UserError
from project.plan.resolve import Plan


def check_resumable(resuming: dict[str, Any] | None, plan: Plan | None) -> None:
    """Refuse (``UserError``) a resume whose accumulation or global batch differ from the checkpoint's."""
    saved, saved_accumulation = (resuming or {}).get("global_batch_size"), (resuming or {}).get("accumulation", 1)
    # What the loader accumulates: where a layer splits whole steps itself (micro_batch auto), 1.
    accumulation = plan.loader_batches[1] if plan is not None else None
    if accumulation is not None and saved is not None and accumulation != saved_accumulation:
        raise UserError(
            f"the checkpoint was trained with an accumulation of {saved_accumulation} loader batches per step, "
            f"this run's would be {accumulation}: the data position could not continue; resume with "
            f"--parallel.accumulation {saved_accumulation} and --parallel.global_batch_size {saved}"
        )
    if saved is not None and plan is not None and plan.global_batch_size not in (None, saved):
        raise UserError(
            f"the checkpoint was trained with global batches of {saved} samples, this run's would be "
            f"{plan.global_batch_size} ({plan.per_device_batch_size} per process x {plan.layout.dp_size_name} "
            f"{plan.dp_size}): the data order could not continue; resume with --parallel.global_batch_size {saved}, "
            "or start a new training from its weights with --model.init_args.weights"
        )
