"""``python -m project sweep --config BASE.yaml [...] --sweep SPACE.yaml [--n_trials N] [--study NAME]``.

The driver samples, starts trials and reads their results; it imports neither torch nor Lightning. Parameters are
drawn here, once per trial (``study.ask`` and the space's distributions), never in the ranks: every rank of a trial
gets the same values on its command line, and the study records exactly what ran.

``--n_trials N`` is the number of finished trials (complete, pruned or failed) the study should end with. Trials a
killed driver left RUNNING are continued first, under their own number and parameters, with ``--resume auto`` in
their own run folder; then new trials are asked for until N have finished. So ``kill -9`` of the driver and the
same command again lose no trial and run none twice.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any, NoReturn

from project.errors import UserError, run_reporting_user_errors
from project.extras.sweep.finish import finish
from project.extras.sweep.loop import Sweep, run_trials
from project.extras.sweep.space import read_space
from project.extras.sweep.study import StudyPaths, hold_study, new_folders, open_study, remove_empty

DESCRIPTION = (
    "Search hyperparameters on Optuna. Each trial is `python -m project fit` with the base configs, the space's "
    "fixed overrides and the trial's values, on whatever layout the configs name. The study lives in "
    "logs/sweeps/NAME/; the same command continues it. See docs/extras/sweep.md."
)


class _Parser(argparse.ArgumentParser):
    """argparse, its mistakes one line (exit code 2) like every command's."""

    def error(self, message: str) -> NoReturn:
        """Raise the mistake as a :class:`UserError`."""
        raise UserError(f"{message} (see python -m project sweep --help)")


def parse_options(argv: list[str]) -> argparse.Namespace:
    """The sweep's command line."""
    parser = _Parser(prog="python -m project sweep", description=DESCRIPTION)
    parser.add_argument("--config", action="append", required=True, metavar="FILE", help="a base config (repeatable)")
    parser.add_argument("--sweep", required=True, metavar="FILE", help="the space file: configs/sweep/digits.yaml")
    parser.add_argument("--n_trials", type=int, metavar="N", help="finished trials to end with (default: the file's)")
    parser.add_argument("--study", metavar="NAME", help="the study, in logs/sweeps/NAME (default: the file's name)")
    options = parser.parse_args(argv)
    if options.n_trials is not None and options.n_trials < 1:
        raise UserError(f"--n_trials {options.n_trials} must be >= 1")
    return options


class Interrupted(BaseException):
    """The driver got SIGTERM: the trial it runs is told to save and stop, and stays RUNNING."""


def _interrupt(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def main(argv: list[str]) -> None:
    """Run the sweep; exit codes: 0 done, 1 no trial completed, 2 bad input, 75/130/143 stopped (run it again)."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        run_reporting_user_errors(lambda: sweep(argv))
    except (KeyboardInterrupt, Interrupted) as stop:
        print("Interrupted: the trial that was running stays RUNNING; the same command continues it", file=sys.stderr)
        raise SystemExit(128 + (stop.args[0] if isinstance(stop, Interrupted) else signal.SIGINT)) from None


def sweep(argv: list[str]) -> None:
    """Parse, lock the study, check the space once, run trials until ``n_trials`` have finished, report."""
    options = parse_options(argv)
    space = read_space(options.sweep)
    paths = StudyPaths(options.study or space.path.stem)
    created = new_folders(paths)
    lock = hold_study(paths)
    try:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        print(f"Study {paths.name}: {paths.folder} (storage {paths.storage})", flush=True)
        study, setup, storage = open_study(paths, options.config, space)
        run = Sweep(study, storage, setup, space, paths, options.n_trials or space.n_trials)
        finished = sum(trial.state.is_finished() for trial in study.get_trials(deepcopy=False))
        run.say(f"Objective: {setup.direction} {setup.metric}; {finished} of {run.n_trials} trials finished so far")
        run_trials(run)
        finish(run)
    finally:
        lock.release()
        remove_empty(created)  # a new study refused before its study.db was created leaves nothing
