"""Lightning's MLFlowLogger for one run that outlives its processes: no step twice, parameters kept, status right.

Built on rank 0 only, for a run :func:`project.extras.tracking.store.open_run` opened (the logger never creates one:
its ``run_id`` is always given). Imported only when a fit is tracked.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from mlflow.entities import Param, RunTag

from project.extras.tracking.config import Store
from project.extras.tracking.ledger import StepMarks, flatten, split_params
from project.extras.tracking.store import OpenedRun

#: MLflow's limit on parameters (and tags) in one ``log_batch`` call.
_BATCH = 100
#: How a fit ended, when Lightning only says "failed": stopped on purpose, or refused before it trained.
Outcome = Literal["stopped", "refused"]


class ProjectMLFlowLogger(MLFlowLogger):
    """MLFlowLogger on a run opened beforehand, which a resumed fit continues instead of repeating.

    - a metric is logged at a step above the highest one the run holds for it, never again at one step;
    - a parameter keeps its first value; a later, different one is the tag ``changed/<key>``;
    - a fit stopped by a signal (preemption, Ctrl+C) ends as KILLED, one refused before its first step is deleted.

    Args:
        store: Where the run is.
        opened: The run and what it holds already.
        start_step: The step this fit starts from (the checkpoint's), named in the ``changed/`` tags.
    """

    def __init__(self, store: Store, opened: OpenedRun, start_step: int) -> None:
        # synchronous: what was logged before a checkpoint is in the store when a kill comes after it.
        super().__init__(
            experiment_name=store.experiment,
            tracking_uri=store.uri,
            artifact_location=store.artifact_location,
            run_id=opened.run_id,
            synchronous=True,
        )
        self.created = opened.created
        self.start_step = start_step
        self.marks = StepMarks(opened.marks)
        self.params = dict(opened.params)
        self.run_tags = dict(opened.tags)
        self.outcome: Outcome | None = None
        self.deleted = False
        _ = self.experiment  # the run is open from here on, so that finalize always ends it

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """The metrics this run does not hold at ``step`` or later yet."""
        kept = self.marks.keep(metrics, step or 0)
        if kept:
            super().log_metrics(kept, step)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """New parameters as parameters; a changed value as a ``changed/<key>`` tag (MLflow's are immutable)."""
        flat = flatten(vars(params) if isinstance(params, Namespace) else dict(params))
        new, changed = split_params(flat, self.params, self.run_tags, self.start_step)
        entries = [Param(k, v) for k, v in new.items()]
        tags = [RunTag(k, v) for k, v in changed.items()]
        for start in range(0, max(len(entries), len(tags)), _BATCH):
            chunk = slice(start, start + _BATCH)
            self.experiment.log_batch(self.run_id, params=entries[chunk], tags=tags[chunk], synchronous=True)
        self.params.update(new)
        self.run_tags.update(changed)

    @rank_zero_only
    def log_files(self, run_dir: str, names: tuple[str, ...]) -> None:
        """The run directory's files and folders ``names`` as artifacts, under the same names (those that exist)."""
        for name in names:
            path = Path(run_dir) / name
            if path.is_dir():
                self.experiment.log_artifacts(self.run_id, str(path), name)
            elif path.is_file():
                self.experiment.log_artifact(self.run_id, str(path))

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """End the run: FINISHED, FAILED, KILLED when stopped on purpose; deleted when refused before training."""
        if self.deleted:
            return
        if self.outcome == "refused" and status == "failed":
            self.experiment.delete_run(self.run_id)  # the run directory is removed too: as if never started
            self.deleted = True
            return
        super().finalize("KILLED" if self.outcome == "stopped" and status == "failed" else status)
