"""A command's config beyond model and data (:mod:`project.build`): run options, notes, the saved config.yaml."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import warnings
from typing import Any, Literal

import lightning as L
from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks.progress import ProgressBar as LightningProgressBar
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback
from lightning.pytorch.profilers import PassThroughProfiler

from project.checkpoints.atomic import atomic_write_text
from project.commands import COMMANDS
from project.errors import UserError
from project.layers import hooks
from project.plan.config import MOVED_FIELDS, ParallelConfig
from project.plan.strategies import UNNAMED_STRATEGIES

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


class NoProfiler(PassThroughProfiler):
    """Lightning's "no profiler" without the context manager it opens around every hook, dozens of times a step."""

    _NOTHING = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext:  # type: ignore[override]
        """A context that does nothing."""
        return self._NOTHING


class SaveUserConfig(SaveConfigCallback):
    """``config.yaml`` without the run options, so ``test --config <run>/config.yaml`` takes a run's own file."""

    def __init__(self, parser: LightningArgumentParser, config: Namespace, **kwargs: Any) -> None:
        config = config.clone()
        for key in RUN_OPTIONS:
            if key in config:
                del config[key]
        unpin_versions(config.get("trainer") or Namespace())
        super().__init__(parser, config, **kwargs)
        self.parser = _WholeFileSaver(parser)  # type: ignore[assignment]


class _WholeFileSaver:
    """The parser, whose ``save`` writes config.yaml whole or not at all (a kill mid-write left an empty file)."""

    def __init__(self, parser: LightningArgumentParser) -> None:
        self._parser = parser

    def save(self, config: Namespace, path: str, skip_none: bool = False, **_: Any) -> None:
        """Dump ``config`` and write it to ``path`` in one rename."""
        atomic_write_text(path, self._parser.dump(config, skip_none=skip_none))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


def unpin_versions(trainer: Namespace) -> None:
    """Drop the loggers' ``version`` from a config to be saved: a run's config starts a new run, never this one.

    ``--resume auto`` pins the resumed run's version; saved, ``fit --config <run>/config.yaml`` would train inside
    the old run and ``test`` would overwrite its files.
    """
    for logger in listed(trainer.get("logger")):
        init_args = logger.get("init_args") if isinstance(logger, Namespace) else None
        if isinstance(init_args, Namespace) and init_args.get("version") is not None:
            init_args.version = None


def say_replaced_optimizer(model: L.LightningModule | None, optimizer: Any) -> None:
    """One line when the config's ``optimizer:`` section replaces the module's own (LightningCLI does it silently)."""
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


def several_processes(trainer: Namespace, gpus: int) -> bool:
    """Whether Lightning's own trainer settings ask for more than one process (devices, nodes, a strategy)."""
    devices = trainer.get("devices")
    if isinstance(devices, str):
        devices = gpus if devices.strip() in ("auto", "-1") else len(devices.split(",")) if "," in devices else devices
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    count = gpus if devices == -1 else int(devices) if str(devices).isdigit() else 1
    return count > 1 or int(trainer.get("num_nodes") or 1) > 1 or trainer.get("strategy") not in UNNAMED_STRATEGIES


def say_plain_lightning(trainer: Namespace, gpus: int) -> None:
    """One ``note:`` (rank 0): a config without ``parallel:`` asking for several processes runs plain Lightning."""
    if rank_zero_only.rank == 0 and several_processes(trainer, gpus):
        sys.stderr.write(
            "note: no parallel: section, so --trainer.devices/num_nodes/strategy run as plain Lightning, without the "
            "template's guarantees (the loader's batch size is per process, DistributedSampler pads evaluation); "
            "for them add a parallel section, e.g. --config configs/parallel/cpu_ddp.yaml (CPU processes) "
            "or configs/parallel/ddp.yaml (GPUs), and drop the trainer's devices/strategy\n"
        )


def quiet_third_party() -> None:
    """Silence two lines of every run that no user can act on, and nothing else.

    Lightning's "Tip: ... try installing litlogger" (an advertisement), and torch 2.13's ``LeafSpec`` FutureWarning,
    raised on every batch by Lightning 2.6's own code.
    """

    def not_the_tip(record: logging.LogRecord) -> bool:
        return "litlogger" not in str(record.msg)

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(not_the_tip)
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )


def wants_template_progress_bar(trainer_config: dict[str, Any]) -> bool:
    """Whether the run gets the template's progress bar: not when barebones, turned off, or one is configured."""
    if trainer_config.get("barebones") or trainer_config.get("enable_progress_bar") is False:
        return False
    return not any(isinstance(c, LightningProgressBar) for c in listed(trainer_config.get("callbacks")))


def listed(value: Any) -> list[Any]:
    """A config value that may be one item, a list of them, or nothing, as a list."""
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def refuse_trainer_overlap(parallel: Any, trainer: Namespace, defaults: Namespace) -> None:
    """Refuse a plan-owned ``trainer.<key>`` set beside the ``parallel`` section, naming the section's setting.

    ``trainer.accumulate_grad_batches: N`` means exactly ``parallel.accumulation: N``: taken as that, with a note,
    unless the section sets its own accumulation.
    """
    if parallel is None:
        return
    accumulate = trainer.get("accumulate_grad_batches")
    if accumulate != defaults.get("accumulate_grad_batches") and parallel.get("accumulation") is None:
        parallel.accumulation, trainer.accumulate_grad_batches = accumulate, defaults.get("accumulate_grad_batches")
        if rank_zero_only.rank == 0:
            sys.stderr.write(
                f"note: trainer.accumulate_grad_batches={accumulate} is taken as parallel.accumulation: {accumulate} "
                "(the parallel section decides the batch arithmetic; the run's config.yaml says it there)\n"
            )
    # The parallel section's name for a trainer setting (devices, num_nodes, ... are the same).
    renamed = {"accelerator": "scenario", "strategy": "scenario", "accumulate_grad_batches": "accumulation"}
    for key in PLAN_OWNED_TRAINER_KEYS:
        value = trainer.get(key)
        if value != defaults.get(key):
            setting = f"parallel.{renamed.get(key, key)}"
            # 'ddp_find_unused_parameters_true', or DDPStrategy with find_unused_parameters=True
            if key == "strategy" and re.search(r"find_unused_parameters\W*_?true", str(value), re.IGNORECASE):
                setting = "`parallel.ddp.find_unused_parameters: true`"
            raise UserError(
                f"trainer.{key}={value!r} and the parallel section both set the layout; "
                f"drop trainer.{key} and set {setting} instead (the parallel section decides it), "
                "or set `parallel: null` to use plain Lightning trainer settings"
            )


def add_sections(parser: LightningArgumentParser) -> None:
    """The sections every command takes, so each takes a run's config.yaml: ``parallel`` and each layer's."""
    parser.add_argument(
        "--parallel",
        type=ParallelConfig | None,
        default=None,
        help="The seed's DP/DDP scenarios as one section; see configs/parallel/ and `plan`. "
        "null leaves the layout to the trainer settings (plain Lightning).",
    )
    parser.moved_options = {f"parallel.{old}": f"parallel.{new}" for old, new in MOVED_FIELDS.items()}
    for add_section in hooks("sections"):  # the layers' sections (tracking)
        add_section(parser)


def add_run_options(parser: LightningArgumentParser, command: str) -> None:
    """The run options, as ``command``'s row says: ``--ckpt_path``, ``--resume`` (trains), ``--test_after_fit``."""
    row = COMMANDS[command]
    parser.add_argument(
        "--ckpt_path",
        type=str | None,
        default=None,
        help="Checkpoint to start from: a file, `last` (the newest good one of this run name) or `none` "
        "(validate/test/predict the weights the config builds, on purpose).",
    )
    if row.trains:
        parser.add_argument(
            "--resume",
            type=Literal["auto"] | None,
            default=None,
            help="auto: continue from the newest good checkpoint of this run name, in its run folder "
            "(a new run when there is none). `--ckpt_path last` does the same.",
        )
    if row.tests_after:
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=True,
            help="After fit, test the best checkpoint (the last weights when there is none).",
        )
