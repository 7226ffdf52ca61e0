"""Write ``plan.json`` into the run directory: the resolved plan, what the Trainer built, what guarantees hold.

A callback with a ``plan_record(trainer) -> dict`` method (a layer's: the elastic job's range) adds its entries.
"""

from __future__ import annotations

import json
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import GradientAccumulationScheduler

from project.checkpoints.atomic import atomic_write_text
from project.plan.resolve import Plan
from project.run_state import RunState
from project.runs import run_directory


class RunRecordCallback(L.Callback):
    """Record the run's plan (none with ``parallel: null``), the runtime layout and the loaders' guarantees."""

    def __init__(self, state: RunState | None = None) -> None:
        self.state = state if state is not None else RunState()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Write plan.json (rank 0); again at the next stage of the same run (fit, then test)."""
        log_dir = run_directory(trainer)
        if log_dir is not None and trainer.is_global_zero:
            self.write(trainer, log_dir)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rewrite it with the validation loaders' guarantees, which exist once the sanity check built them."""
        self.setup(trainer, pl_module, "fit")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``validate``: its loaders exist now (during fit, on_train_start covers validation)."""
        if trainer.state.fn == "validate":
            self.setup(trainer, pl_module, "validate")

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """With the test loaders' guarantees."""
        self.setup(trainer, pl_module, "test")

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """With the predict loaders' guarantees."""
        self.setup(trainer, pl_module, "predict")

    def write(self, trainer: L.Trainer, log_dir: str) -> None:
        """The record, written atomically."""
        plan = self.state.plan
        record: dict[str, Any] = plan.to_dict() if plan is not None else {"scenario": "lightning (no parallel section)"}
        cluster = getattr(trainer.strategy, "cluster_environment", None)  # none on one device
        record["runtime"] = {
            "world_size": trainer.world_size,
            "num_nodes": trainer.num_nodes,
            "num_devices": trainer.num_devices,
            "strategy": type(trainer.strategy).__name__,
            "accelerator": type(trainer.accelerator).__name__,
            # Lightning's own launcher detection (Lightning-, TorchElastic- or SLURMEnvironment).
            "cluster_environment": type(cluster).__name__ if cluster is not None else None,
        }
        if styles := getattr(trainer.strategy, "tensor_styles", None):  # what tensor parallelism split, in this run
            record["runtime"]["tensor_parallel"] = dict(styles)
        if plan is None:
            record["world_size"] = trainer.world_size
        record["guarantees"] = dict(self.state.guarantees)
        if plan is not None and (schedule := accumulation_schedule(trainer, plan)):
            record["accumulation_schedule"] = schedule
            steps = ", ".join(f"epoch {epoch}: {row['global_batch_size']}" for epoch, row in schedule.items())
            record["notes"] = [*record["notes"], f"GradientAccumulationScheduler: global batches from {steps}"]
        for callback in trainer.callbacks:  # a layer's entries (elastic: the range, what a loss costs)
            entries = getattr(callback, "plan_record", None)
            record.update(entries(trainer) if callable(entries) else {})
        atomic_write_text(f"{log_dir}/plan.json", json.dumps(record, indent=2, default=str) + "\n")


def accumulation_schedule(trainer: L.Trainer, plan: Plan) -> dict[str, dict[str, int]]:
    """A ``GradientAccumulationScheduler``'s epochs: the accumulation and global batch from each; ``{}`` without one."""
    scheduler = next((c for c in trainer.callbacks if isinstance(c, GradientAccumulationScheduler)), None)
    per_step, _ = plan.loader_batches
    if scheduler is None or per_step is None:
        return {}
    return {
        str(epoch): {"accumulation": factor, "global_batch_size": per_step * plan.dp_size * factor}
        for epoch, factor in sorted(scheduler.scheduling.items())
    }
