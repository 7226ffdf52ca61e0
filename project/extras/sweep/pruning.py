"""Inside a trial of ``python -m project sweep``: report each validation to the study, stop every rank when pruned.

Installed on every ``fit`` whose environment names a trial (:data:`project.extras.sweep.contract.TRIAL_ENV`, set by the
driver), from :func:`project.callbacks.template_callbacks`; elsewhere it is absent and Optuna is never imported.

At the end of each validation of the fit (not the sanity check), rank 0 reads the monitored metric, records it in
the trial's result file, reports it to the study at the optimizer step and asks the study's pruner. Its verdict is
broadcast to every rank, once per validation (never per step), so all ranks set ``should_stop`` together and stop at
the same step; the process then ends normally and the result file says ``pruned``, which the driver tells the study.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import lightning as L

from project.errors import UserError
from project.extras.sweep.contract import TrialResult, TrialSpec, open_storage, trial_id
from project.extras.sweep.space import PrunerSettings
from project.runs import run_directory


def sweep_trial_callbacks(state: Any = None, row: Any = None, config: Any = None) -> list[L.Callback]:
    """``[SweepTrialCallback]`` when this process is a trial of a sweep (its environment says so), else ``[]``."""
    spec = TrialSpec.from_env()
    return [SweepTrialCallback(spec)] if spec is not None else []


class SweepTrialCallback(L.Callback):
    """Report the monitored metric of each validation to the study; stop all ranks at once when it prunes the trial.

    Args:
        spec: The study, trial, metric and result file, from the driver.
    """

    def __init__(self, spec: TrialSpec) -> None:
        self.spec = spec
        self.run_dir: str | None = None
        self._reporter: _StudyReporter | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Learn the run directory (a collective: every rank asks)."""
        self.run_dir = run_directory(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rank 0 reports and asks the pruner; every rank gets its verdict in one broadcast."""
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        verdict = self._judge(trainer) if trainer.is_global_zero else None
        prune, error = trainer.strategy.broadcast(verdict, src=0)
        if error is not None:
            raise UserError(error)  # on every rank alike: rank 0 says it, the others end quietly
        if prune:
            trainer.should_stop = True

    def _judge(self, trainer: L.Trainer) -> tuple[bool, str | None]:
        """(pruned, error): the value recorded and reported, the pruner asked (rank 0 only)."""
        metric = self.spec.metric
        value = trainer.callback_metrics.get(metric)
        if value is None:
            logged = ", ".join(sorted(trainer.callback_metrics)) or "nothing"
            return False, f"the sweep optimises {metric!r}, which validation does not log (it logs {logged})"
        value, step = float(value), trainer.global_step
        result = TrialResult.read(self.spec.result) or TrialResult(metric)
        result.values[step], result.run_dir = value, self.run_dir
        result.pruned = self.reporter().report(value, step)
        result.write(self.spec.result)
        if result.pruned:
            print(f"Trial {self.spec.number} pruned at step {step}: {metric} {value:.6g}", file=sys.stderr, flush=True)
        return result.pruned, None

    def reporter(self) -> _StudyReporter:
        """The study's trial, opened once (Optuna is imported here, on rank 0 of a trial only)."""
        if self._reporter is None:
            self._reporter = _StudyReporter(self.spec)
        return self._reporter


class _StudyReporter:
    """Trial ``spec.number`` of the study, with the study's pruner."""

    def __init__(self, spec: TrialSpec) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = open_storage(spec.storage)
        study = optuna.load_study(study_name=spec.study, storage=storage, pruner=PrunerSettings(**spec.pruner).build())
        self.trial: Any = optuna.Trial(study, trial_id(storage, spec.study, spec.number))

    def report(self, value: float, step: int) -> bool:
        """Report ``value`` at ``step``; whether the pruner stops the trial here."""
        with warnings.catch_warnings():
            # A resumed trial reports again the steps its killed run had reported: Optuna keeps the first value.
            warnings.simplefilter("ignore")
            self.trial.report(value, step)
        return bool(self.trial.should_prune())
