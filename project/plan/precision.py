"""``parallel.precision``: the Trainer's precision, owned by the plan and checked against the hardware."""

from __future__ import annotations

from project.errors import UserError


def check_precision(precision: str, accelerator: str) -> str:
    """The plan's note on ``precision`` on ``accelerator`` (``""`` for 32); ``16-mixed`` on CPU is refused."""
    if precision == "16-mixed" and accelerator == "cpu":
        raise UserError(
            "parallel.precision='16-mixed' needs GPUs (float16 autocast and its gradient scaler are for CUDA); "
            "on CPU use 'bf16-mixed' (CPU autocast) or '32'"
        )
    if precision == "32":
        return ""
    where = "CPU autocast" if accelerator == "cpu" else "CUDA autocast"
    half = "bfloat16" if precision == "bf16-mixed" else "float16 with a gradient scaler"
    return f"precision {precision}: {where} to {half}; parameters, gradients and optimizer state stay float32"
