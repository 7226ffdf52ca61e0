"""The end of a sweep: the best trial, the table of trials, ``trials.csv`` and the plots, and where the study is."""

from __future__ import annotations

import sys

from rich.console import Console

from project.errors import RunFailure
from project.extras.sweep.loop import Sweep
from project.extras.sweep.plots import save_plots
from project.extras.sweep.report import print_best, print_table, write_csv

CSV_NAME = "trials.csv"


def finish(run: Sweep) -> None:
    """Print and save what the study found.

    Raises:
        RunFailure: no trial completed (exit code 1), after the table and the CSV say why.
    """
    from optuna.trial import TrialState

    # Piped to a file or a job's log, the table keeps its full width (rich would fold it to 80 columns).
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    trials = run.study.get_trials(deepcopy=False)
    print_table(trials, run.setup.metric, console)
    write_csv(trials, run.paths.folder / CSV_NAME)
    console.print(f"Trials: {run.paths.folder / CSV_NAME}")
    for note in save_plots(run.study, run.paths.folder):
        console.print(f"Plot: {note}")
    complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    if complete:
        print_best(run.study.best_trial, run.setup.metric, console)
    console.print(f"Study {run.paths.name}: {run.paths.folder} (storage {run.paths.storage})")
    if not complete:
        raise RunFailure(
            f"no trial of study {run.paths.name} completed ({len(trials)} finished); the errors are in "
            f"{run.paths.folder / CSV_NAME} and each trial's stderr.log"
        )
