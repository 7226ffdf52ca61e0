"""The driver's loop: trials continued or asked for, each run as a process, told to the study, one line each."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from project.errors import Preempted
from project.extras.sweep.contract import TRIAL_ENV, TrialResult, TrialSpec, trial_id
from project.extras.sweep.report import describe, format_number
from project.extras.sweep.setup import Setup
from project.extras.sweep.space import Parameter, Space
from project.extras.sweep.study import StudyPaths
from project.extras.sweep.trials import Verdict, judge, run_trial_process, trial_command

_DONE = {"COMPLETE": "completed", "PRUNED": "pruned", "FAIL": "failed"}


@dataclass
class Sweep:
    """One driver's study and what it runs the trials with."""

    study: Any
    storage: Any
    setup: Setup
    space: Space
    paths: StudyPaths
    n_trials: int

    def say(self, line: str) -> None:
        """One progress line."""
        print(line, flush=True)


def run_trials(run: Sweep) -> None:
    """Continue the trials a dead driver left RUNNING, then ask new ones, until ``n_trials`` have finished."""
    from optuna.trial import TrialState

    while True:
        trials = run.study.get_trials(deepcopy=False)
        finished = sum(trial.state.is_finished() for trial in trials)
        if finished >= run.n_trials:
            return
        left = next((trial for trial in trials if trial.state == TrialState.RUNNING), None)
        run_one(run, left.number if left is not None else None)


def run_one(run: Sweep, resumed: int | None) -> None:
    """Run trial ``resumed`` again (``--resume auto``), or a new one; tell the study what became of it."""
    import optuna

    if resumed is None:
        trial = run.study.ask()
    else:
        trial = optuna.Trial(run.study, trial_id(run.storage, run.paths.name, resumed))
    params = {parameter.key: suggest(trial, parameter) for parameter in run.space.parameters}
    folder = run.paths.trial_dir(trial.number)
    trial.set_user_attr("trial_dir", str(folder))
    result_file = folder / "result.json"
    if resumed is None:
        result_file.unlink(missing_ok=True)  # a study made again under an old name: nothing of the old trial counts
    earlier = TrialResult.read(result_file)
    if resumed is not None and earlier is not None and earlier.pruned:
        verdict, took = Verdict("PRUNED"), 0.0  # pruned and ended; its driver died before telling the study
    else:
        verdict, took = _run_process(run, trial.number, {**trial.params, **params}, resumed is not None)
    result = TrialResult.read(result_file)
    if result is not None and result.run_dir:
        trial.set_user_attr("run_dir", result.run_dir)
    if verdict.error:
        trial.set_user_attr("error", verdict.error)
    _tell(run.study, trial.number, verdict)
    run.say(_progress(run, trial.number, verdict, took, result))


def _run_process(run: Sweep, number: int, params: dict[str, Any], resume: bool) -> tuple[Verdict, float]:
    folder = run.paths.trial_dir(number)
    command = trial_command(run.setup, run.space, run.paths, number, params) + (["--resume", "auto"] if resume else [])
    result = str(folder / "result.json")
    spec = TrialSpec(run.paths.storage, run.paths.name, number, run.setup.metric, result, run.space.pruner.as_dict())
    run.say(f"Trial {number} {'resumed' if resume else 'started'}: {describe(params)} (logs in {folder})")
    outcome = run_trial_process(command, {**os.environ, TRIAL_ENV: spec.to_env()}, folder)
    verdict = judge(outcome, TrialResult.read(folder / "result.json"), run.setup)
    if verdict is None:
        raise Preempted(
            f"trial {number} was stopped by a signal and saved (exit code {Preempted.exit_code}); it stays RUNNING: "
            "run the same command again to continue the study"
        )
    return verdict, outcome.seconds


def suggest(trial: Any, parameter: Parameter) -> Any:
    """The trial's value of ``parameter``: drawn now, or the one it has (a resumed trial keeps its values)."""
    if parameter.type == "categorical":
        return trial.suggest_categorical(parameter.key, list(parameter.choices))
    if parameter.type == "float":
        return trial.suggest_float(parameter.key, parameter.low, parameter.high, log=parameter.log, step=parameter.step)
    return trial.suggest_int(parameter.key, parameter.low, parameter.high, log=parameter.log, step=parameter.step or 1)


def _tell(study: Any, number: int, verdict: Verdict) -> None:
    from optuna.trial import TrialState

    state = TrialState[verdict.state]
    study.tell(number, verdict.value if state == TrialState.COMPLETE else None, state=state)


def _progress(run: Sweep, number: int, verdict: Verdict, took: float, result: TrialResult | None) -> str:
    what = verdict.error or ""
    if verdict.value is not None:
        what = f"{run.setup.metric} {format_number(verdict.value)}"
    elif verdict.state == "PRUNED" and result is not None and result.values:
        step = max(result.values)
        what = f"at step {step}, {run.setup.metric} {format_number(result.values[step])}"
    line = f"Trial {number} {_DONE[verdict.state]} in {took:.0f} s{': ' + what if what else ''}"
    try:
        best = run.study.best_trial
        line += f" | best {format_number(best.value)} (trial {best.number})"
    except ValueError:  # no trial completed yet
        pass
    finished = sum(trial.state.is_finished() for trial in run.study.get_trials(deepcopy=False))
    return f"{line} | {finished}/{run.n_trials} finished"
