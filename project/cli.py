"""``python -m project fit|validate|test|predict|plan|check``: the path of one run, top to bottom.

Build (:class:`project.build.ProjectCLI`), check what can be checked before any process starts, run the command
(``fit`` then tests the best checkpoint), say where the run went. A failure names its rank and stops the others; a
run refused before its first optimizer step leaves nothing behind. Bad input: one line, exit code 2.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden

from project.build import ProjectCLI
from project.callbacks.best_checkpoint import best_checkpoint_path
from project.callbacks.model_checks import skipped_step_error
from project.callbacks.preemption import stopped_by_signal
from project.checkpoints.loading import pickle_allowed
from project.checkpoints.match import refuse_mismatched_checkpoint, refuse_unknown_weights
from project.checkpoints.resume import remove_partial_writes
from project.commands import Builds, Command, split_command
from project.config_errors import check_config_files
from project.errors import Preempted, UserError, exit_with, run_reporting_user_errors
from project.launch import stop_signals
from project.launch.legacy import strip_legacy_local_rank
from project.layers import hook
from project.lightning_private import stop_launched_processes
from project.parallel.collectives import leave_together
from project.parallel.failures import defer_to_rank_zero, error_from_worker, explain_rank_failure
from project.plan.launchers import LEGACY_FLAG_ENV
from project.plan_command import print_plan
from project.run_guard import RunDirectoryGuard
from project.run_lock import TrainingLock
from project.run_store import active
from project.runs import run_directory


@dataclass
class Run:
    """What ``python -m project COMMAND`` built and ran (for notebooks and tests that drive it in-process)."""

    command: str
    cli: ProjectCLI
    trainer: L.Trainer
    model: L.LightningModule
    datamodule: L.LightningDataModule


def execute(argv: list[str]) -> Run | None:
    """Run ``python -m project`` with ``argv`` (without the program name); the :class:`Run`, or ``None`` for plan."""
    args, legacy = strip_legacy_local_rank(argv)
    command, args = split_command(args)
    if command.runner is not None:  # a layer's driver (sweep) or file operation (consolidate): no config, no Trainer
        hook(command.runner)(args)
        return None
    check_config_files(args)
    if legacy:
        os.environ[LEGACY_FLAG_ENV] = "1"
    cli = ProjectCLI(command.name, args)
    if command.builds is Builds.MODEL_AND_DATA:  # plan: print the layout, run nothing
        print_plan(cli)
        return None
    if command.self_test:  # check: here, on the layout as configured; no checkpoint, nothing to say afterwards
        run_command(command, cli)
        return None
    refuse_unknown_weights(command.name, cli.model, cli.chosen, cli.config.get("ckpt_path"))
    refuse_mismatched_checkpoint(cli.chosen, cli.model, cli.trainer)
    if cli.submit is not None:  # parallel.launcher: ray: the launcher's workers run this same command; this one waits
        stop_signals.install([], 0.0)  # the waiting driver ends on a signal as processes do; the workers stop
        cli.submit(argv, command.name, cli.state.built, run_in_worker)
        return None
    try:
        run_command(command, cli)
    finally:
        stop_signals.finish()  # a signal from here on changes nothing: the command is done
    say_where_the_run_went(cli.trainer)
    return Run(command.name, cli, cli.trainer, cli.model, cli.datamodule)


def run_in_worker(argv: list[str]) -> str | None:
    """One worker of a submitted job (a layer's: Ray's) runs the command: rank 0 returns its run directory."""
    run = execute(argv)
    return run_directory(run.trainer) if run is not None else None


def has_test_to_run(model: L.LightningModule, data: L.LightningDataModule | None) -> str | None:
    """Why ``fit`` cannot test after training (no ``test_step``, no test data); ``None`` when it can."""
    if not is_overridden("test_step", model):
        return f"{type(model).__name__} has no test_step"
    if not any(is_overridden("test_dataloader", owner) for owner in (data, model) if owner is not None):
        return f"{type(data or model).__name__} has no test_dataloader"
    return None


def _test_after_fit(cli: ProjectCLI) -> None:
    """Test the best checkpoint (the last weights when there is none), unless there is nothing to test."""
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    missing = has_test_to_run(model, data)
    if missing is not None:
        if trainer.is_global_zero:
            print(f"No test after fit: {missing} (--test_after_fit false says so quietly)", flush=True)
        return
    # The path, not "best": Lightning's "best" is the first ModelCheckpoint's (last.ckpt's saver is one), with a warning
    trainer.test(model, datamodule=data, ckpt_path=best_checkpoint_path(trainer))


def run_command(command: Command, cli: ProjectCLI) -> None:
    """Run ``command`` on the built objects; on failure name the rank, stop the others, clean up a refused run.

    Only a run refused before its first optimizer step is cleaned up: once it trained, every file it wrote is kept.
    """
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    ckpt_path = cli.chosen.path if cli.chosen is not None else None
    start_step = int((cli.chosen.checkpoint or {}).get("global_step", 0)) if cli.chosen is not None else 0
    guard = RunDirectoryGuard.of(trainer, continuing=command.trains and cli.chosen is not None)
    # One training per run directory: a second fit there is refused, in one line naming the one training there.
    lock = TrainingLock.take(guard.run_dir, hold=command.locks_run and trainer.is_global_zero)
    remove_partial_writes(cli.chosen)  # a killed save's leftovers, now that no other training writes there
    stop_signals.set_undo(guard.undo if command.stops_on_signal and trainer.is_global_zero else None)
    start = {"ckpt_path": ckpt_path, "weights_only": not pickle_allowed()} if command.takes_checkpoint else {}
    try:
        getattr(trainer, str(command.trainer_method))(model, datamodule=data, **start)
        if command.tests_after and cli.config.get("test_after_fit"):
            _test_after_fit(cli)
    except BaseException as error:
        failure = _explain(command, cli, error, start_step)  # before the other ranks are stopped: see there
        stop_launched_processes(trainer.strategy)
        trained = command.trains and trainer.global_step > start_step
        if isinstance(failure or error, UserError):
            defer_to_rank_zero(trainer)  # every rank refuses alike: rank 0 says it once and stops the others
            if trained:  # a finished (or started) training is never undone: say what failed, keep every file
                kept = f"; everything it wrote is kept in {guard.run_dir}" if guard.run_dir is not None else ""
                failure = UserError(f"training reached step {trainer.global_step}{kept}, then: {failure or error}")
            elif trainer.is_global_zero:
                guard.undo()  # refused before training (e.g. by the sanity check): leave nothing behind
        elif isinstance(failure, Preempted) and not trained and trainer.is_global_zero:
            guard.undo()  # stopped before its first step: `--resume auto` starts it again in the same folder
        if failure is not None:
            raise failure from error
        raise
    finally:
        lock.release()


def _explain(command: Command, cli: ProjectCLI, error: BaseException, start_step: int) -> BaseException | None:
    """What ended ``command``, as one line: a stop signal, a worker's error, a lost or stuck rank; else None.

    Called before the other ranks are stopped, so that the rank that died first is told apart.
    """
    trainer = cli.trainer
    timeout_s = cli.state.built.strategy_args.get("timeout_s") if cli.state.built is not None else None
    restored = f"{cli.chosen.path} (step {start_step})" if cli.chosen is not None else None
    if command.self_test:
        return error_from_worker(error) or explain_rank_failure(
            error, trainer, timeout_s, "--join_timeout_s", "then run check again"
        )
    return (
        stopped_by_signal(error, trainer, restored)
        or error_from_worker(error)
        or skipped_step_error(error, trainer)
        or explain_rank_failure(error, trainer, timeout_s)
    )


def say_where_the_run_went(trainer: L.Trainer) -> None:
    """``Run directory: logs/<name>/version_<n>`` (rank 0); ``s3://.../version_<n> (cache: ...)`` in a store."""
    log_dir = run_directory(trainer)
    if trainer.is_global_zero and log_dir and Path(log_dir).is_dir():
        print(f"Run directory: {active().shown(log_dir)}", flush=True)  # in object storage: its URL, then the cache


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m project``; ``argv`` defaults to the command line."""
    stop_signals.own_process()  # the stop signals stay handled until this process exits

    def run() -> None:
        args = sys.argv[1:] if argv is None else list(argv)
        if argv is None:
            # Lightning's launcher re-runs sys.argv for ranks 1..N-1: keep it equal to what is parsed.
            sys.argv[1:] = strip_legacy_local_rank(args)[0]
        execute(args)
        leave_together()  # rank 0 last: it hosts the rendezvous store under Lightning's launcher and SLURM

    try:
        run_reporting_user_errors(run)
    except stop_signals.StopSignal as stop:  # while the run was being built: nothing ran yet
        exit_with(stop_signals.stopped_early(stop), code=Preempted.exit_code)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
