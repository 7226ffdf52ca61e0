"""From the command line to live objects: LightningCLI, on its public API, plus the ``parallel`` section.

:class:`ProjectCLI` parses one command's options, chooses the checkpoint (which may point the logger at the resumed
run) and resolves the layout before anything is built, then builds the model, the data and a Trainer from that
layout (``plan``: model and data only). :mod:`project.cli` runs the command.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from jsonargparse import ActionYesNo
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from project import run_config
from project.callbacks import BarrierCallback, LoaderGuaranteesCallback, StopOnSignal, template_callbacks
from project.callbacks.dispatch import skip_idle_batch_hooks
from project.callbacks.float64 import Float64BeforeRestore
from project.callbacks.model_checks import (
    refuse_manual_accumulation,
    refuse_rank_local_finders,
    refuse_unshardable_callbacks,
)
from project.checkpoints.background import with_atomic_checkpoint_io
from project.checkpoints.resume import Chosen, choose_checkpoint
from project.commands import COMMANDS
from project.config_errors import ProjectArgumentParser, root_cause
from project.errors import UserError
from project.launch.ranks import confirm_started_ranks
from project.launch.submit import submitter
from project.layers import hook, hooks
from project.parallel.strategies import trainer_kwargs
from project.parallel.threads import apply_cpu_threads
from project.parser_stubs import resolve_stubs_in_process
from project.plan.config import Hardware, ParallelConfig
from project.plan.environment import detect_environment, refuse_stray_rank
from project.run_state import RunState
from project.run_store import open_run
from project.runs import run_of_config

# LightningCLI warns when it is given args while sys.argv has some; main() passes what it parsed on purpose.
warnings.filterwarnings("ignore", message=r"LightningCLI's args parameter is intended")
# Said in one line by run_config.say_replaced_optimizer, which also names the way out.
warnings.filterwarnings("ignore", message=r"`.*configure_optimizers` will be overridden by")
run_config.quiet_third_party()  # two lines no user can act on (Lightning's litlogger tip, a torch deprecation)
resolve_stubs_in_process()  # before `python -m project` forks its ranks: no process starts one to learn sys.path


@rank_zero_only
def say_unwritten_predictions(callbacks: list[Any]) -> None:
    """``predict`` without a prediction writer: Lightning's own predict, whose results no file keeps (one line)."""
    if not any(isinstance(callback, BasePredictionWriter) for callback in callbacks):
        sys.stderr.write(
            "note: predict writes no file: no prediction writer is installed; list a BasePredictionWriter in "
            "trainer.callbacks (the predictions layer writes predictions.csv)\n"
        )


class ProjectCLI(LightningCLI):
    """LightningCLI for one command of ``python -m project``, given the command line after the command."""

    def __init__(self, command: str, args: list[str]) -> None:
        self.command = command
        self.row = COMMANDS[command]  # what the command builds and does
        self.state = RunState()  # the parallel section, the plan, the loaders' guarantees: handed to the callbacks
        self.chosen: Chosen | None = None
        self.loaders: LoaderGuaranteesCallback | None = None
        self.submit: Callable[..., None] | None = None  # a layer's submission of the job elsewhere (ray)
        super().__init__(
            model_class=L.LightningModule,
            datamodule_class=L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=None if self.row.self_test else run_config.SaveUserConfig,
            # Each run gets a fresh version directory (or continues its own): an existing config.yaml is expected.
            save_config_kwargs={"overwrite": True},
            parser_class=ProjectArgumentParser,
            parser_kwargs={"prog": f"python -m project {command}"},
            args=args,
            run=False,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """The ``parallel`` section, the layers' sections, and this command's run options."""
        run_config.add_sections(parser)
        if not self.row.builds_trainer:  # plan
            parser.add_argument("--assume_gpus", type=int | None, default=None, help="Plan for a machine with N GPUs.")
            parser.add_argument("--json", action=ActionYesNo, default=False, help="Print one JSON object.")
            return
        if self.row.arguments is not None:  # a layer's command (check): its own options instead of the run's
            hook(self.row.arguments)(parser)
            return
        run_config.add_run_options(parser, self.command)

    def before_instantiate_classes(self) -> None:
        """Choose the checkpoint and resolve the layout, before anything is built."""
        config = self.config
        if not self.row.trains:  # it saves nothing: which checkpoint-callback state it does not reload is noise
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
        environment = detect_environment()  # read once, before confirm_started_ranks sets this rank's variables
        if self.row.builds_trainer:
            refuse_stray_rank(environment)
        if self.row.takes_checkpoint:
            open_run(config)  # save_dir a URL: its store's local cache (a layer's); refused without one
            run = run_of_config(config.get("config") or [])
            self.chosen = choose_checkpoint(self.command, config.ckpt_path, config.get("resume"), config.trainer, run)
        parallel = config.get("parallel")
        if parallel is None and self.row.builds_trainer:
            confirm_started_ranks(None)  # ranks forked at start-up for a section the parser does not see: refused
            run_config.say_plain_lightning(config.trainer, torch.cuda.device_count())
            return
        run_config.refuse_trainer_overlap(parallel, config.trainer, self.parser.get_defaults().trainer)
        settings = ParallelConfig(**parallel.as_dict()) if parallel is not None else ParallelConfig()
        if self.row.settings is not None:  # a layer's command adjusts the section (check: its short timeout)
            settings = hook(self.row.settings)(settings, config)
        self.submit = submitter(settings.launcher, environment)  # refused here if no layer submits to it
        assumed = config.get("assume_gpus")
        if assumed is not None and assumed < 0:
            raise UserError(f"--assume_gpus={assumed} must be >= 0")
        hardware = Hardware(torch.cuda.device_count()) if assumed is None else Hardware(assumed, assumed=True)
        with contextlib.ExitStack() as layers:  # the layers' hooks around the plan (elastic: a restart's batch)
            for around_plan in hooks("around_plan"):
                settings = layers.enter_context(around_plan(settings, environment, self._resuming(), self.row))
            self.state = RunState(settings, hardware)
            for on_state in hooks("on_state"):  # the layers' (microbatch: takes micro_batch auto, changes every plan)
                on_state(self.state, config)
            if self.row.builds_trainer:  # `plan` resolves with the data batch size, and says why a launch would fail
                self.state.built = self.state.resolve(environment, None)
        plan = self.state.built
        if plan is not None:
            if plan.accelerator == "cpu":
                processes = plan.devices if isinstance(plan.devices, int) else 1
                apply_cpu_threads(processes, settings.cpu_threads, rank_zero_only.rank)
            seed = config.get("seed_everything")
            self.loaders = LoaderGuaranteesCallback(self.state, seed if isinstance(seed, int) else 0, self._resuming())
            # After the plan read the environment: the forked ranks must match it, then Lightning starts none.
            confirm_started_ranks(plan)

    def _resuming(self) -> dict[str, Any] | None:
        """The loader callback's state in the chosen checkpoint (its position and global batch size)."""
        states = (self.chosen.checkpoint or {}).get("callbacks", {}) if self.chosen is not None else {}
        name = LoaderGuaranteesCallback.__qualname__  # Lightning's state key of a callback without state_key args
        return states.get(name) if isinstance(states, dict) else None

    def instantiate_classes(self) -> None:
        """Build model, data and trainer (`plan`: model and data only); a bad init argument is one line."""
        try:
            if not self.row.builds_trainer:  # plan
                self.config_init = self.parser.instantiate_classes(self.config)
                self.datamodule, self.model = self.config_init.get("data"), self.config_init.get("model")
                return
            super().instantiate_classes()
        except (ValueError, TypeError, MisconfigurationException) as error:
            # Raised by the user's classes for bad init args (e.g. dropout=2): a config mistake.
            cause: BaseException | None = error
            while cause is not None and not isinstance(cause, UserError):
                cause = cause.__cause__  # jsonargparse wraps what the classes raise in its own ValueError
            if cause is not None:
                raise cause from None
            raise UserError(f"could not build the model/data/trainer from the config: {root_cause(error)}") from error
        if self.row.steps_optimizer:  # before any process starts; evaluation never accumulates
            accumulation = self.trainer.accumulate_grad_batches
            refuse_manual_accumulation(self.model, accumulation, self.state.section, self.state.built)
            refuse_unshardable_callbacks(self.trainer)
            refuse_rank_local_finders(self.trainer)
        if self.row.trains:
            run_config.say_replaced_optimizer(self.model, self.config.get("optimizer"))

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """The Trainer, with the plan's layout, atomic checkpoint IO and the template's callbacks."""
        trainer_config, plan = self.config_init["trainer"], self.state.built
        if plan is not None:
            kwargs = {**trainer_kwargs(plan), **kwargs}
        kwargs["plugins"] = with_atomic_checkpoint_io(trainer_config.get("plugins"))
        if kwargs.get("precision") == "64":  # as a plugin: Lightning's ModelParallelStrategy refuses the flag only
            from lightning.pytorch.plugins import DoublePrecision

            kwargs["precision"] = None
            kwargs["plugins"] = [*kwargs["plugins"], DoublePrecision()]
        if trainer_config.get("profiler") is None and not trainer_config.get("barebones"):
            kwargs["profiler"] = run_config.NoProfiler()  # Lightning's default without its per-hook cost
        chosen = self.chosen.path if self.chosen is not None else None
        section = self.state.section or ParallelConfig()
        stop = StopOnSignal(section.stop_signals, section.stop_grace_s) if self.row.stops_on_signal else None
        bar = run_config.wants_template_progress_bar(trainer_config)
        own = template_callbacks(self.state, self.loaders, chosen, bar, stop)
        # What the model itself must become: float64 before a restore
        shaping: list[L.Callback] = [Float64BeforeRestore()] if plan is not None and plan.precision == "64" else []
        # The layers' own (a sweep trial's pruning, the hang recorder), after the template's; a self-test keeps them
        layered = [c for callbacks in hooks("callbacks") for c in callbacks(self.state, self.row, self.config)]
        kwargs["callbacks"] = [*run_config.listed(trainer_config.get("callbacks")), *own, *shaping, *layered]
        if self.row.trainer_method == "predict":
            say_unwritten_predictions(kwargs["callbacks"])
        if self.row.trainer_kwargs is not None:  # a self-test (check): the layout and model as configured, no records
            kept = [self.loaders] if self.loaders is not None else []
            kwargs.update(hook(self.row.trainer_kwargs)(self.config, [*kept, *shaping, *layered]))
        trainer = super().instantiate_trainer(**kwargs)
        for on_trainer in hooks("on_trainer"):  # the layers' hooks on the built Trainer (tracking: MLflow beside it)
            on_trainer(trainer, self.config, self.chosen, self.row)
        skip_idle_batch_hooks(trainer.callbacks)  # Lightning's own defaults (summary, checkpoint) included
        group_timeout_s = plan.strategy_args.get("timeout_s") if plan is not None else None
        for barrier in (c for c in trainer.callbacks if isinstance(c, BarrierCallback)):
            barrier.group_timeout_s = group_timeout_s  # the seed's synchronize() waits no longer than a collective
        return trainer
