"""From the command line to live objects: LightningCLI, on its public API, plus the ``parallel`` section.

:class:`ProjectCLI` parses one command's options (``run=False``: :mod:`project.cli` runs the command),
then, before anything is built, chooses the checkpoint (which may point the logger at the run being
resumed) and resolves the layout; it builds the model, the datamodule and a Trainer whose layout, checkpoint
IO and template callbacks come from that resolution. ``plan`` builds the model and datamodule only.
"""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from dataclasses import replace
from typing import Any, Literal

import lightning as L
import torch
from jsonargparse import ActionYesNo, Namespace
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks.progress import ProgressBar as LightningProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.profilers import PassThroughProfiler

from project.callbacks import LoaderGuaranteesCallback, StragglerCallback, lists_prediction_writer, template_callbacks
from project.callbacks.dispatch import skip_idle_batch_hooks
from project.callbacks.model_checks import refuse_manual_accumulation
from project.check.command import add_check_arguments, check_trainer_kwargs
from project.checkpoints.background import with_atomic_checkpoint_io
from project.checkpoints.resume import Chosen, choose_checkpoint
from project.config_errors import ProjectArgumentParser, root_cause
from project.errors import UserError
from project.launch.ranks import confirm_started_ranks
from project.parallel.compile import CompileAfterWrap
from project.parallel.strategies import trainer_kwargs
from project.parallel.threads import apply_cpu_threads
from project.plan.config import Hardware, ParallelConfig
from project.plan.environment import detect_environment, refuse_stray_rank
from project.plan.resolve import Plan, resolve_plan
from project.runs import run_of_config

# Trainer settings that the plan decides when `parallel` is given.
PLAN_OWNED_TRAINER_KEYS = (
    "accelerator",
    "devices",
    "strategy",
    "num_nodes",
    "sync_batchnorm",
    "accumulate_grad_batches",
    "precision",
)
# Options that say how to run this command, not what to train: never saved into the run's config.yaml.
RUN_OPTIONS = ("ckpt_path", "resume", "test_after_fit", "assume_gpus", "json")
# LightningCLI warns when it is given args while sys.argv has some; main() passes what it parsed on purpose.
warnings.filterwarnings("ignore", message=r"LightningCLI's args parameter is intended")
# Said in one line by say_replaced_optimizer, which also names the way out.
warnings.filterwarnings("ignore", message=r"`.*configure_optimizers` will be overridden by")


class NoProfiler(PassThroughProfiler):
    """Lightning's "no profiler" without the generator context manager it opens around every hook call.

    The Trainer enters ``profiler.profile(...)`` around each callback and module hook, dozens of times a
    step; a shared ``nullcontext`` makes that nearly free when no profiler was asked for.
    """

    _NOTHING = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext:  # type: ignore[override]
        """A context that does nothing."""
        return self._NOTHING


class SaveUserConfig(SaveConfigCallback):
    """``config.yaml`` as the user configured the run: without the options that only say how to run it.

    So ``test --config <run>/config.yaml`` (or ``validate``, ``predict``) takes a run's own config file.
    """

    def __init__(self, parser: LightningArgumentParser, config: Namespace, **kwargs: Any) -> None:
        config = config.clone()
        for key in RUN_OPTIONS:
            if key in config:
                del config[key]
        unpin_versions(config.get("trainer") or Namespace())
        super().__init__(parser, config, **kwargs)


def unpin_versions(trainer: Namespace) -> None:
    """Drop the loggers' ``version`` from a config to be saved: a run's config starts a new run, never this one.

    ``--resume auto`` points the logger at the resumed run's version; saved as such, ``fit --config
    <run>/config.yaml`` would train again inside the old run and ``test`` would overwrite its files.
    """
    for logger in _listed(trainer.get("logger")):
        init_args = logger.get("init_args") if isinstance(logger, Namespace) else None
        if isinstance(init_args, Namespace) and init_args.get("version") is not None:
            init_args.version = None


def say_replaced_optimizer(model: L.LightningModule | None, optimizer: Any) -> None:
    """One line, before training, when the config's ``optimizer:`` section replaces the module's own optimizers.

    LightningCLI puts the section's optimizer (and ``lr_scheduler:``) in place of ``configure_optimizers``; a user
    who started from ``configs/digits.yaml`` would otherwise train with AdamW without knowing.
    """
    if model is None or not isinstance(optimizer, Namespace) or not optimizer.get("class_path"):
        return
    if type(model).configure_optimizers is L.LightningModule.configure_optimizers:
        return  # the module leaves its optimizer to the config, as Classifier does
    if rank_zero_only.rank == 0:
        sys.stderr.write(
            f"note: the config's optimizer: section ({optimizer.class_path}) replaces "
            f"{type(model).__name__}.configure_optimizers; to keep the module's own, drop optimizer:/lr_scheduler: "
            "(configs/own_module.yaml has neither)\n"
        )


def wants_template_progress_bar(trainer_config: dict[str, Any]) -> bool:
    """Whether the run gets the template's progress bar: not when barebones, turned off, or one is configured."""
    if trainer_config.get("barebones") or trainer_config.get("enable_progress_bar") is False:
        return False
    return not any(isinstance(c, LightningProgressBar) for c in _listed(trainer_config.get("callbacks")))


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class ProjectCLI(LightningCLI):
    """LightningCLI for one command (``fit``, ``validate``, ``test``, ``predict``, ``plan``) of ``python -m project``.

    Args:
        command: The command; its options are added to the parser.
        args: The command line after the command.
    """

    def __init__(self, command: str, args: list[str]) -> None:
        self.command = command
        self.plan: Plan | None = None
        self.plan_inputs: tuple[ParallelConfig, Hardware] | None = None
        self.chosen: Chosen | None = None
        self.loaders: LoaderGuaranteesCallback | None = None
        super().__init__(
            model_class=L.LightningModule,
            datamodule_class=L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=None if command == "check" else SaveUserConfig,
            # Each run gets a fresh version directory (or continues its own): an existing config.yaml is expected.
            save_config_kwargs={"overwrite": True},
            parser_class=ProjectArgumentParser,
            parser_kwargs={"prog": f"python -m project {command}"},
            args=args,
            run=False,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """The ``parallel`` section, and this command's run options."""
        parser.add_argument(
            "--parallel",
            type=ParallelConfig | None,
            default=None,
            help="The seed's DP/DDP scenarios as one section; see configs/parallel/ and `plan`. "
            "null leaves the layout to the trainer settings (plain Lightning).",
        )
        if self.command == "plan":
            parser.add_argument("--assume_gpus", type=int | None, default=None, help="Plan for a machine with N GPUs.")
            parser.add_argument("--json", action=ActionYesNo, default=False, help="Print one JSON object.")
            return
        if self.command == "check":
            add_check_arguments(parser)
            return
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="Checkpoint to start from: a file, `last` (the newest good one of this run name) or `none` "
            "(validate/test/predict the weights the config builds, on purpose).",
        )
        if self.command == "fit":
            parser.add_argument(
                "--resume",
                type=Literal["auto"] | None,
                default=None,
                help="auto: continue from the newest good checkpoint of this run name, in its run folder "
                "(a new run when there is none). `--ckpt_path last` does the same.",
            )
            parser.add_argument(
                "--test_after_fit",
                type=bool,
                default=True,
                help="After fit, test the best checkpoint (the last weights when there is none).",
            )

    def before_instantiate_classes(self) -> None:
        """Choose the checkpoint and resolve the layout, before anything is built."""
        config = self.config
        environment = detect_environment()  # read once, before confirm_started_ranks sets this rank's variables
        if self.command != "plan":
            refuse_stray_rank(environment)
        if self.command not in ("plan", "check"):
            run = run_of_config(config.get("config") or [])
            self.chosen = choose_checkpoint(self.command, config.ckpt_path, config.get("resume"), config.trainer, run)
        parallel = config.get("parallel")
        if parallel is None and self.command != "plan":
            confirm_started_ranks(None)  # ranks forked at start-up for a section the parser does not see: refused
            return
        self._refuse_trainer_overlap(parallel)
        settings = ParallelConfig(**parallel.as_dict()) if parallel is not None else ParallelConfig()
        if self.command == "check":  # a rank that does not answer is named after the check's short timeout
            settings = replace(settings, timeout_s=min(settings.timeout_s, config.join_timeout_s))
        assumed = config.get("assume_gpus")
        if assumed is not None and assumed < 0:
            raise UserError(f"--assume_gpus={assumed} must be >= 0")
        hardware = Hardware(torch.cuda.device_count()) if assumed is None else Hardware(assumed, assumed=True)
        self.plan_inputs = (settings, hardware)
        if self.command != "plan":  # `plan` resolves with the data batch size, and says why a launch would fail
            self.plan = resolve_plan(settings, hardware, environment, None, self.configured_lr())
            if self.plan.accelerator == "cpu":
                processes = self.plan.devices if isinstance(self.plan.devices, int) else 1
                apply_cpu_threads(processes, settings.cpu_threads, rank_zero_only.rank)
            seed = config.get("seed_everything")
            self.loaders = LoaderGuaranteesCallback(self.plan, seed if isinstance(seed, int) else 0, self._resuming())
            # After the plan read the environment: the forked ranks must match it, then Lightning starts none.
            confirm_started_ranks(self.plan)

    def configured_lr(self) -> float | None:
        """The learning rate of the config's ``optimizer:`` section, if it has one."""
        lr = (self.config.get("optimizer") or Namespace()).get("init_args", Namespace()).get("lr")
        return float(lr) if isinstance(lr, (int, float)) else None

    def _resuming(self) -> dict[str, Any] | None:
        """The loader callback's state in the chosen checkpoint (its position and global batch size)."""
        states = (self.chosen.checkpoint or {}).get("callbacks", {}) if self.chosen is not None else {}
        name = LoaderGuaranteesCallback.__qualname__  # Lightning's state key of a callback without state_key args
        return states.get(name) if isinstance(states, dict) else None

    def _stragglers(self) -> StragglerCallback | None:
        """Straggler detection when the plan has several processes and the section asks for it."""
        settings = self.plan_inputs[0] if self.plan_inputs is not None else None
        if settings is not None and (settings.straggler_every_n_steps < 0 or settings.straggler_factor <= 1):
            raise UserError(
                f"parallel.straggler_every_n_steps={settings.straggler_every_n_steps} must be >= 0 (0: off) and "
                f"parallel.straggler_factor={settings.straggler_factor} > 1 (times the median of the other ranks)"
            )
        if self.plan is None or settings is None or self.plan.world_size == 1 or settings.straggler_every_n_steps < 1:
            return None
        return StragglerCallback(settings.straggler_every_n_steps, settings.straggler_factor)

    def _refuse_trainer_overlap(self, parallel: Any) -> None:
        """A plan-owned trainer setting beside the ``parallel`` section: one line naming the section's own setting."""
        if parallel is None:
            return
        # The parallel section's name for each trainer setting (devices, num_nodes, ... are the same).
        renamed = {"accelerator": "scenario", "strategy": "scenario", "accumulate_grad_batches": "accumulation"}
        defaults = self.parser.get_defaults().trainer
        for key in PLAN_OWNED_TRAINER_KEYS:
            value = self.config.trainer.get(key)
            if value != defaults.get(key):
                setting = f"parallel.{renamed.get(key, key)}"
                # 'ddp_find_unused_parameters_true', or DDPStrategy with find_unused_parameters=True
                if key == "strategy" and re.search(r"find_unused_parameters\W*_?true", str(value), re.IGNORECASE):
                    setting = "`parallel.find_unused_parameters: true`"
                raise UserError(
                    f"trainer.{key}={value!r} and the parallel section both set the layout; "
                    f"drop trainer.{key} and set {setting} instead (the parallel section decides it), "
                    "or set `parallel: null` to use plain Lightning trainer settings"
                )

    def instantiate_classes(self) -> None:
        """Build model, data and trainer (`plan`: model and data only); a bad init argument is one line."""
        try:
            if self.command == "plan":
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
        if self.command in ("fit", "check"):  # before any process starts; evaluation never accumulates
            settings = self.plan_inputs[0] if self.plan_inputs is not None else None
            refuse_manual_accumulation(self.model, self.trainer.accumulate_grad_batches, settings, self.plan)
        if self.command == "fit":
            say_replaced_optimizer(self.model, self.config.get("optimizer"))

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """The Trainer, with the plan's layout, atomic checkpoint IO and the template's callbacks."""
        trainer_config = self.config_init["trainer"]
        if self.plan is not None:
            kwargs = {**trainer_kwargs(self.plan), **kwargs}
        kwargs["plugins"] = with_atomic_checkpoint_io(trainer_config.get("plugins"))
        if trainer_config.get("profiler") is None and not trainer_config.get("barebones"):
            kwargs["profiler"] = NoProfiler()  # Lightning's default without its per-hook cost
        chosen = self.chosen.path if self.chosen is not None else None
        settings = self.plan_inputs[0] if self.plan_inputs is not None else None
        learning_rate = settings is not None and (settings.lr_scaling != "none" or settings.warmup_steps > 0)
        listed = _listed(trainer_config.get("callbacks"))
        writer = self.command == "predict" and not lists_prediction_writer(listed)  # predictions.csv by default
        bar = wants_template_progress_bar(trainer_config)
        own = template_callbacks(self.loaders, chosen, bar, learning_rate, self._stragglers(), writer)
        # torch.compile once the strategy has wrapped the model
        compiled = [CompileAfterWrap()] if self.plan is not None and self.plan.compile else []
        kwargs["callbacks"] = [*listed, *own, *compiled]
        if self.command == "check":  # the layout, the sampling and the model as configured; nothing written
            kept = [self.loaders] if self.loaders is not None else []
            kwargs.update(check_trainer_kwargs(self.config, [*kept, *compiled]))
        trainer = super().instantiate_trainer(**kwargs)
        skip_idle_batch_hooks(trainer.callbacks)  # Lightning's own defaults (summary, checkpoint) included
        return trainer
