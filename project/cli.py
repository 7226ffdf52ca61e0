"""``python -m project fit|validate|test|predict|plan``: LightningCLI plus the ``parallel`` section.

What this adds to LightningCLI, and nothing more:

- ``parallel``: resolved into a :class:`~project.parallel.plan.Plan` before anything is built; the
  plan owns the Trainer's accelerator/devices/strategy/num_nodes/sync_batchnorm and the per-device
  batch size, and is written to ``plan.json`` in the run directory.
- ``plan``: prints that resolution (``--json`` for machines, ``--assume_gpus N`` for another machine).
- ``fit`` tests the best checkpoint afterwards (``--test_after_fit``) and says where the run went.
- ``fit --resume auto`` (and ``--ckpt_path last``) continues the newest good checkpoint of the run
  name in its run directory; checkpoints are written atomically and resume exactly (random state too).
- Legacy ``--local_rank``/``--local-rank`` from ``torch.distributed.launch`` is accepted and checked.
- Bad input (unknown or bad values, missing files) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.distributed as dist
from jsonargparse import ActionYesNo, Namespace
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks.progress import ProgressBar as LightningProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from project.callbacks.progress import ProgressBar
from project.callbacks.resume import ResumeCallback
from project.callbacks.run_record import RunRecordCallback
from project.checkpointing import with_atomic_checkpoint_io
from project.config_errors import ProjectArgumentParser, check_config_files, root_cause
from project.errors import UserError, run_reporting_user_errors
from project.export import pickle_allowed, safe_load
from project.parallel.environment import LEGACY_FLAG_ENV, detect_environment, strip_legacy_local_rank
from project.parallel.failures import explain_rank_failure
from project.parallel.plan import Hardware, LaunchMismatchError, ParallelConfig, Plan, resolve_plan
from project.resume import resolve_resume

# Trainer settings that the plan decides when `parallel` is given.
PLAN_OWNED_TRAINER_KEYS = ("accelerator", "devices", "strategy", "num_nodes", "sync_batchnorm")
# Values of --ckpt_path that Lightning resolves itself.
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, Namespace):
        return value.as_dict()
    if isinstance(value, dict):
        return dict(value)
    return dict(vars(value))


class NoProfiler(PassThroughProfiler):
    """Lightning's "no profiler" without the generator context manager it opens around every hook call.

    The Trainer enters ``profiler.profile(...)`` around each callback and module hook, dozens of times a
    step; a shared ``nullcontext`` makes that nearly free when no profiler was asked for.
    """

    _NOTHING = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext:  # type: ignore[override]
        """A context that does nothing."""
        return self._NOTHING


class ProjectCLI(LightningCLI):
    """LightningCLI with the ``parallel`` section and the ``plan`` subcommand."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("model_class", L.LightningModule)
        kwargs.setdefault("datamodule_class", L.LightningDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        # Each run gets a fresh version directory, so an existing config.yaml is never a reason to fail.
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_class", ProjectArgumentParser)
        self.plan: Plan | None = None
        super().__init__(*args, **kwargs)

    # ----------------------------------------------------------------- parser
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add the ``parallel`` section (``null`` leaves the trainer settings to plain Lightning)."""
        parser.add_argument(
            "--parallel",
            type=ParallelConfig | None,
            default=None,
            help="The seed's DP/DDP scenarios as one section; see configs/parallel/ and `plan`.",
        )

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        super()._add_subcommands(parser, **kwargs)
        self._subcommand_parsers["fit"].add_argument(
            "--test_after_fit",
            type=bool,
            default=True,
            help="After fit, test the best checkpoint (the last weights when there is none).",
        )
        self._subcommand_parsers["fit"].add_argument(
            "--resume",
            type=Literal["auto"] | None,
            default=None,
            help="auto: continue from the newest good checkpoint of this run name, in its run folder "
            "(a new run when there is none). `--ckpt_path last` does the same.",
        )
        plan_parser = self.init_parser(description="Resolve the parallel layout without training.")
        self._add_arguments(plan_parser)
        plan_parser.add_argument("--assume_gpus", type=int | None, default=None, help="Plan for a machine with N GPUs.")
        plan_parser.add_argument("--json", action=ActionYesNo, default=False, help="Print one JSON object.")
        self._subcommand_parsers["plan"] = plan_parser
        self._subcommand_method_arguments["plan"] = []
        assert parser._subcommands_action is not None
        parser._subcommands_action.add_subcommand(
            "plan", plan_parser, help="Resolve the parallel layout without training."
        )

    # ------------------------------------------------------------- resolution
    def _parse_ckpt_path(self) -> None:
        """Refuse a missing, corrupt or unsafe --ckpt_path with one line, before anything is built."""
        subcommand = self.config.get("subcommand")
        if subcommand:
            resolve_resume(self.config[subcommand], subcommand)  # --resume auto / --ckpt_path last -> a file
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and ckpt_path not in SPECIAL_CKPT_PATHS:
            checkpoint = safe_load(ckpt_path)  # raises UserError naming the file
            if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
                raise UserError(f"--ckpt_path '{ckpt_path}' is not a Lightning checkpoint (no state_dict)")
        # No super(): LightningCLI would rebuild the model from the checkpoint's hyperparameters, silently
        # overriding the config. Here the config decides, and a checkpoint that does not fit it is refused.

    def _section(self) -> Namespace:
        return self.config[self.subcommand] if self.subcommand else self.config

    def before_instantiate_classes(self) -> None:
        """Resolve the ``parallel`` section into a plan and apply its batch size to the data config."""
        config = self._section()
        parallel = config.get("parallel")
        assume = config.get("assume_gpus") if self.subcommand == "plan" else None
        if parallel is None and self.subcommand != "plan":
            return
        self._refuse_trainer_overlap(config, parallel)
        settings = ParallelConfig(**_as_dict(parallel)) if parallel is not None else ParallelConfig()
        if assume is not None and assume < 0:
            raise UserError(f"--assume_gpus={assume} must be >= 0")
        hardware = Hardware(gpus=torch.cuda.device_count(), assumed=False) if assume is None else Hardware(assume, True)
        self.plan = self._resolve_plan(settings, hardware, self._data_batch_size(config))
        data = config.get("data")
        if self.plan.per_device_batch_size is not None and data is not None and "batch_size" in data.init_args:
            data.init_args.batch_size = self.plan.per_device_batch_size

    def _resolve_plan(self, settings: ParallelConfig, hardware: Hardware, data_batch_size: int | None) -> Plan:
        environment = detect_environment()
        try:
            return resolve_plan(settings, hardware, environment, data_batch_size)
        except LaunchMismatchError as error:
            if self.subcommand != "plan":
                raise
            # `plan` says what would happen: the config's own layout, and why the launcher's does not fit it.
            unset = replace(environment, world_size=None, local_world_size=None, num_nodes=None)
            plan = resolve_plan(settings, hardware, unset, data_batch_size)
            return replace(plan, notes=(*plan.notes, f"will not start under {environment.launcher}: {error}"))

    def _data_batch_size(self, config: Namespace) -> int | None:
        data = config.get("data")
        if data is None or not isinstance(data, Namespace) or "init_args" not in data:
            return None
        value = data.init_args.get("batch_size")
        return int(value) if isinstance(value, int) else None

    def _refuse_trainer_overlap(self, config: Namespace, parallel: Any) -> None:
        if parallel is None:
            return
        defaults = self._parser(self.subcommand).get_defaults().trainer
        for key in PLAN_OWNED_TRAINER_KEYS:
            value = config.trainer.get(key)
            if value != defaults.get(key):
                raise UserError(
                    f"trainer.{key}={value!r} and the parallel section both set the layout; "
                    f"drop trainer.{key} (the parallel section decides it), or set `parallel: null` "
                    "to use plain Lightning trainer settings"
                )

    # ---------------------------------------------------------- instantiation
    def instantiate_classes(self) -> None:
        """Build model, data and trainer; `plan` builds nothing."""
        if self.subcommand == "plan":
            return
        try:
            super().instantiate_classes()
        except (ValueError, TypeError, MisconfigurationException) as error:
            # Raised by the user's classes for bad init args (e.g. dropout=2): a config mistake.
            cause: BaseException | None = error
            while cause is not None and not isinstance(cause, UserError):
                cause = cause.__cause__  # jsonargparse wraps what the classes raise in its own ValueError
            if cause is not None:
                raise cause from None
            raise UserError(f"could not build the model/data/trainer from the config: {root_cause(error)}") from error

    @staticmethod
    def _lighter_defaults(trainer_config: Any, kwargs: dict[str, Any]) -> None:
        """Lightning's defaults without their per-step cost, unless the config chose otherwise.

        A profiler that is really off, and a progress bar that redraws a few times a second instead of
        after every batch. ``barebones`` runs have neither.
        """

        def setting(key: str) -> Any:
            return kwargs.get(key, trainer_config.get(key))

        if setting("barebones"):
            return
        if setting("profiler") is None:
            kwargs["profiler"] = NoProfiler()
        callbacks = setting("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        if setting("enable_progress_bar") is not False and not any(
            isinstance(c, LightningProgressBar) for c in callbacks
        ):
            kwargs["callbacks"] = [*callbacks, ProgressBar()]

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """The Trainer, with the plan's layout, atomic checkpoint writes, exact resume and the plan.json record."""
        if self.plan is not None:
            kwargs = {**self.plan.trainer_kwargs(), **kwargs}
        trainer_config = self._get(self.config_init, "trainer", default={})
        configured = trainer_config.get("plugins")
        kwargs["plugins"] = with_atomic_checkpoint_io(kwargs.get("plugins", configured))
        self._lighter_defaults(trainer_config, kwargs)
        trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.append(RunRecordCallback(self.plan.to_dict() if self.plan else None))
        trainer.callbacks.append(ResumeCallback(self._section().get("ckpt_path")))
        return trainer

    # -------------------------------------------------------------- running
    def _run_subcommand(self, subcommand: str) -> None:
        if subcommand == "plan":
            self._print_plan()
            return
        self._refuse_mismatched_checkpoint()
        try:
            super()._run_subcommand(subcommand)
        except BaseException as error:
            # Named before the other ranks are stopped, so the rank that died first is told apart.
            timeout_s = self.plan.strategy_args.get("timeout_s") if self.plan is not None else None
            failure = explain_rank_failure(error, self.trainer, timeout_s)
            stop_started_processes(self.trainer)
            if failure is not None:
                raise failure from error
            raise

    def _refuse_mismatched_checkpoint(self) -> None:
        ckpt_path = self._section().get("ckpt_path")
        if not ckpt_path or ckpt_path in SPECIAL_CKPT_PATHS:
            return
        state = safe_load(ckpt_path)["state_dict"]
        own = self.model.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        wrong = [
            f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
            for k in sorted(set(own) & set(state))
            if own[k].shape != state[k].shape
        ]
        if missing or unexpected or wrong:
            run_config = Path(ckpt_path).resolve().parent.parent / "config.yaml"
            config = f"--config {run_config}" if run_config.is_file() else "the config it was trained with"
            found = [("missing keys", missing[:8]), ("unexpected keys", unexpected[:8]), ("shapes", wrong[:4])]
            detail = "; ".join(f"{name} {values}" for name, values in found if values)
            raise UserError(
                f"--ckpt_path '{ckpt_path}' is a checkpoint of another model than the config builds "
                f"({detail}; shapes are checkpoint vs config); run it with {config}"
            )

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """Lightning's loading of --ckpt_path follows safe_load's rule: weights only, unless the user trusts it."""
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if kwargs.get("weights_only") is None:
            kwargs["weights_only"] = not pickle_allowed()
        return kwargs

    def _print_plan(self) -> None:
        assert self.plan is not None
        data = self.plan.to_dict()
        if self._section().get("parallel") is None:
            data["notes"] = [
                *data["notes"],
                "no parallel section: this is what `parallel.scenario: auto` would do",
            ]
        if self._section().get("json"):
            sys.stdout.write(json.dumps(data) + "\n")
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="parallel plan", show_header=False)
        for key, value in data.items():
            table.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
        Console().print(table)

    def after_fit(self) -> None:
        """Test the best checkpoint, then say where the run went."""
        if self._section().get("test_after_fit"):
            checkpoint = self.trainer.checkpoint_callback
            best = getattr(checkpoint, "best_model_path", "") if checkpoint is not None else ""
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if best else None)
        self._say_where_the_run_went()

    def after_test(self) -> None:
        """Say where the test run went."""
        self._say_where_the_run_went()

    def after_predict(self) -> None:
        """Say where the predictions went."""
        self._say_where_the_run_went()

    def after_validate(self) -> None:
        """Say where the validation run went."""
        self._say_where_the_run_went()

    def _say_where_the_run_went(self) -> None:
        log_dir = self.trainer.log_dir
        if self.trainer.is_global_zero and log_dir and Path(log_dir).is_dir():
            print(f"Run directory: {log_dir}", flush=True)


def stop_started_processes(trainer: L.Trainer) -> None:
    """When rank 0 fails, end the ranks its launcher started instead of leaving them waiting forever.

    Lightning kills the other ranks only on Ctrl+C; after any other exception in rank 0 they would
    block in their next collective (or sleep on) with nobody left to talk to.
    """
    launcher = getattr(trainer.strategy, "launcher", None)
    if isinstance(launcher, _SubprocessScriptLauncher) and launcher.procs:
        launcher.kill(signal.SIGKILL)


def leave_process_group() -> None:
    """After a successful run, leave the process group together and cleanly.

    Rank 0 hosts the rendezvous store under Lightning's launcher and SLURM: if it exits while another
    rank still tears down its connections, that rank aborts ("terminate called without an active
    exception", exit code 134) although the run succeeded.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m project``; ``argv`` defaults to the command line."""

    def run() -> None:
        args, legacy = strip_legacy_local_rank(sys.argv[1:] if argv is None else argv)
        check_config_files(args)
        if legacy:
            os.environ[LEGACY_FLAG_ENV] = "1"
        if argv is None:
            # Lightning's launcher re-runs sys.argv for ranks 1..N-1: keep it equal to what we parse.
            sys.argv[1:] = args
            ProjectCLI()
        else:
            ProjectCLI(args=args)
        leave_process_group()

    try:
        run_reporting_user_errors(run)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
