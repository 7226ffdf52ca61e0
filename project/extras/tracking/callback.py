"""One MLflow run per training: opened on rank 0 at fit start, its id known to every rank and kept in checkpoints.

A fit that continues its run directory (``--resume auto``, ``--ckpt_path last``: the checkpoint lies in it) takes
the run id its checkpoint holds, on any number of processes; any other fit opens a new run. Every rank writes the
id into the checkpoints it builds (a sharded fsdp checkpoint is written by every rank), so every rank learns it
from rank 0 once, at fit start.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L

from project.errors import Preempted, UserError
from project.extras.tracking.config import CHECKPOINT_KEY, RUN_ID_KEY, Store, redact
from project.extras.tracking.ledger import plan_params
from project.runs import run_directory

if TYPE_CHECKING:
    from project.extras.tracking.mlflow_logger import ProjectMLFlowLogger

#: The run directory's files logged as artifacts once training starts, and at the end of fit.
START_ARTIFACTS = ("config.yaml", "plan.json")
END_ARTIFACTS = ("export",)


class TrackingCallback(L.Callback):
    """Open the fit's MLflow run (rank 0), tell every rank its id, write it into every checkpoint, log the records.

    Args:
        store: The store, checked before the Trainer was used (:func:`project.extras.tracking.attach.attach_tracking`).
        tags: The ``tracking.tags``.
        resumed: The run id the chosen checkpoint holds, and that checkpoint's path (``None``: no checkpoint).
        start_step: The step the fit starts from (the checkpoint's).
        client: Rank 0's MLflow client that answered the check (``None`` on other ranks).
    """

    def __init__(
        self, store: Store, tags: dict[str, str], resumed: tuple[str | None, str | None], start_step: int, client: Any
    ) -> None:
        self.store = store
        self.tags = dict(tags)
        self.resumed_id, self.resumed_from = resumed
        self.start_step = start_step
        self.client = client
        self.run_id: str | None = None
        self.run_dir: str | None = None
        self.logger: ProjectMLFlowLogger | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Open the run on rank 0, once per fit (the test after fit logs to it too); every rank learns its id."""
        if stage != "fit" or self.run_id is not None:
            return
        self.run_dir = run_directory(trainer)  # every rank: a collective
        opened = self._open(trainer, self.run_dir) if trainer.is_global_zero else None
        # One broadcast per fit: rank 0's id on every rank, which all write it into their checkpoints.
        self.run_id = trainer.strategy.broadcast(opened, src=0)

    def _open(self, trainer: L.Trainer, run_dir: str | None) -> str:
        """Rank 0: the run, new or continued, and its logger beside the run directory's own (TensorBoard) logger."""
        from project.extras.tracking.mlflow_logger import ProjectMLFlowLogger
        from project.extras.tracking.store import RUN_DIR_TAG, open_run

        folder = Path(run_dir).resolve() if run_dir is not None else None
        checkpoint = Path(self.resumed_from).resolve() if self.resumed_from is not None else None
        continues = checkpoint is not None and checkpoint.parent.parent == folder  # one run per run directory
        name = f"{folder.parent.name}/{folder.name}" if folder is not None else self.store.experiment
        tags = {**({RUN_DIR_TAG: str(folder)} if folder is not None else {}), **self.tags}
        try:
            opened = open_run(self.client, self.store, self.resumed_id if continues else None, name, tags)
        except UserError:
            raise
        except Exception as error:  # reachable at the check moments ago: say it in one line, before training
            raise UserError(redact(f"tracking: could not open the MLflow run in {self.store.uri}: {error}")) from error
        self.logger = ProjectMLFlowLogger(self.store, opened, self.start_step)
        trainer.loggers = [*trainer.loggers, self.logger]  # after TensorBoard, which keeps naming the run directory
        verb = "started" if opened.created else "continues"
        sys.stderr.write(f"MLflow run {opened.run_id} ({name}) {verb} in {self.store.shown}\n")
        return opened.run_id

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The plan as parameters, config.yaml and plan.json as artifacts (rank 0: plan.json is written by now)."""
        if self.logger is None or self.run_dir is None:
            return
        plan = Path(self.run_dir) / "plan.json"
        if plan.is_file():
            self.logger.log_hyperparams({"plan": plan_params(json.loads(plan.read_text()))})
        self.logger.log_files(self.run_dir, START_ARTIFACTS)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """After a finished fit: the export (written at fit end) as artifacts."""
        if stage == "fit" and self.logger is not None and self.run_dir is not None:
            self.logger.log_files(self.run_dir, END_ARTIFACTS)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Every rank: the run id at the checkpoint's top level, where a resume reads it before building anything."""
        if self.run_id is not None:
            checkpoint[CHECKPOINT_KEY] = {RUN_ID_KEY: self.run_id}

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Tell the logger how the fit ended before Lightning finalizes it as "failed"."""
        if self.logger is None:
            return
        if isinstance(exception, (Preempted, KeyboardInterrupt)):
            self.logger.outcome = "stopped"  # saved where it stopped: `fit --resume auto` continues this run
        elif isinstance(exception, UserError) and self.logger.created and trainer.global_step <= self.start_step:
            self.logger.outcome = "refused"  # the run directory goes too (project.run_guard)
