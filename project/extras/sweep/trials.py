"""One trial: its ``fit`` command line, its process (which never outlives the driver) and what became of it.

A trial is ``python -m project fit`` with the base configs, the space's fixed overrides and the trial's parameters,
so any layout the base config names (one process, N forked ranks, Lightning's launcher) runs unchanged. Its logger
writes to ``logs/sweeps/<study>/trial_<n>/version_<k>``, so ``--resume auto`` finds its checkpoints when the driver
continues a trial a killed driver left running. Its output goes to ``stdout.log``/``stderr.log`` in that folder.

The process gets the parent-death signal of :mod:`project.launch.orphans` (SIGKILL when the driver dies, however
it dies); its ranks get theirs from it. So a ``kill -9`` of the driver leaves no process behind, and the trial
stays RUNNING in the study, to be resumed by the next driver.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from project.errors import Preempted
from project.extras.sweep.contract import TrialResult
from project.extras.sweep.setup import Setup, config_args, dies_with_driver, last_line, override_args
from project.extras.sweep.space import Space
from project.extras.sweep.study import StudyPaths

#: Seconds a trial has to save and stop after the driver forwards it a SIGTERM (its own grace is 20 s by default).
STOP_GRACE_S = 60.0
#: Bytes of the end of a trial's stderr read for its last line.
_TAIL_BYTES = 65536


@dataclass(frozen=True)
class Outcome:
    """How a trial process ended: exit status, the last line of its stderr, seconds it ran."""

    returncode: int
    last_line: str
    seconds: float


@dataclass(frozen=True)
class Verdict:
    """What to tell the study: COMPLETE with the objective, PRUNED, or FAIL with the one-line error."""

    state: str
    value: float | None = None
    error: str | None = None


def trial_command(setup: Setup, space: Space, paths: StudyPaths, number: int, params: dict[str, Any]) -> list[str]:
    """``python -m project fit ...`` for trial ``number`` with ``params``.

    A sweep selects on validation, so trials skip the test after fit (``fixed: {test_after_fit: true}`` brings
    it back); the fixed overrides and the parameters come after, so they win over the base configs.
    """
    command = [sys.executable, "-m", "project", "fit", *config_args(list(setup.configs)), "--test_after_fit=false"]
    command += [*override_args(space.fixed), *override_args(params)]
    logger = {"save_dir": paths.folder, "name": f"trial_{number}"}  # the trial's own run folders, for --resume auto
    command += [f"--trainer.logger.init_args.{key}={value}" for key, value in logger.items()]
    if setup.tracking:  # the base config tracks runs (tracking.logger): each run says its study and trial
        command.append("--tracking.tags=" + json.dumps({"study": paths.name, "trial": str(number)}))
        if not setup.experiment_named:  # one experiment for the study, not one per trial (the logger's name)
            command.append(f"--tracking.experiment={paths.name}")
    return command


def run_trial_process(command: list[str], env: dict[str, str], folder: Path) -> Outcome:
    """Run the trial in ``folder`` (its logs appended there) until it ends; it dies with this process.

    An interruption of the driver (Ctrl+C, SIGTERM) is passed on: the trial saves and stops (exit code 75), and
    the exception goes on, leaving the trial RUNNING for the next driver to resume.
    """
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (folder / "stdout.log").open("ab") as out, (folder / "stderr.log").open("ab") as err:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, preexec_fn=dies_with_driver())
        try:
            code = process.wait()
        except BaseException:
            _stop(process)
            raise
    return Outcome(code, _last_line(folder / "stderr.log"), time.monotonic() - started)


def judge(outcome: Outcome, result: TrialResult | None, setup: Setup) -> Verdict | None:
    """The verdict of a trial that ended; ``None`` when it was stopped by a signal, saved, to be resumed."""
    if outcome.returncode == Preempted.exit_code:
        return None
    if outcome.returncode < 0:  # a signal from outside (the out-of-memory killer, a user): its output says nothing
        number = -outcome.returncode
        return Verdict("FAIL", error=f"killed by signal {number} ({signal.strsignal(number)})")
    if outcome.returncode != 0:
        return Verdict("FAIL", error=outcome.last_line or f"exit code {outcome.returncode}")
    if result is not None and result.pruned:
        return Verdict("PRUNED")
    best = result.best(setup.maximize) if result is not None else None
    if best is None:
        return Verdict("FAIL", error=f"the run ended without a finite {setup.metric} from validation")
    return Verdict("COMPLETE", value=best)


def _stop(process: subprocess.Popen) -> None:
    """Ask the trial to save and stop (its SIGTERM handler); kill it if it has not ended within the grace period."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _last_line(path: Path) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(0, path.stat().st_size - _TAIL_BYTES))
            return last_line(file.read().decode(errors="replace"))
    except OSError:
        return ""
