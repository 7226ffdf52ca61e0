"""Write ``plan.json`` into the run directory and say where the run went."""

from __future__ import annotations

import json
from typing import Any

import lightning as L

from project.atomic import atomic_write_text


class RunRecordCallback(L.Callback):
    """Record the resolved parallel plan (plus what the Trainer actually built) as ``plan.json``.

    Args:
        plan: The resolved plan as a dict, or ``None`` when the ``parallel`` section is not used.
    """

    def __init__(self, plan: dict[str, Any] | None = None) -> None:
        self.plan = plan
        self.run_dir: str | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Write plan.json once per run (rank 0); every rank learns the run directory."""
        # trainer.log_dir broadcasts from rank 0: every rank must call it, never under a rank check.
        log_dir = trainer.log_dir
        if self.run_dir is not None or log_dir is None:
            return
        self.run_dir = log_dir
        if trainer.is_global_zero and stage == "fit":
            record = dict(self.plan) if self.plan else {"scenario": "lightning (no parallel section)"}
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
            if not self.plan:
                record["world_size"] = trainer.world_size
            atomic_write_text(f"{log_dir}/plan.json", json.dumps(record, indent=2, default=str) + "\n")
