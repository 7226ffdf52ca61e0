"""The commands of ``python -m project``: one row each, and the answers that need no training imports.

Each :class:`Command` row says what its command builds and does; the code reads the row instead of comparing names.
A new command is a new row. ``--help`` and an unknown command are answered here, before Lightning (about 5 s to
import) is: standard library only.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from project.errors import UserError, run_reporting_user_errors


class Builds(Enum):
    """What a command builds before it runs."""

    DRIVER = "its own driver process, which imports no torch (the sweep starts each trial as a fit process)"
    FILES = "nothing but files: no config, no model, no Trainer"
    MODEL_AND_DATA = "the model and the data from the config, no Trainer and no process"
    TRAINER = "the model, the data and a Trainer, in every rank of the layout"


@dataclass(frozen=True)
class Command:
    """One command of ``python -m project`` and every fact the code reads about it; hooks are ``module:function``.

    Attributes:
        name: The command, as typed.
        help: Its line in ``python -m project --help``.
        builds: What it builds before it runs.
        trainer_method: The Trainer method it runs (``check`` runs ``fit`` on a copy of the layout); ``None``: none.
        trains: It keeps what it trains: ``--resume`` continues it; once a step ran, nothing of the run is removed.
        takes_checkpoint: It starts from ``--ckpt_path`` / ``--resume`` (a file or an object store's URL).
        evaluates: It evaluates weights: without a checkpoint (or ``--ckpt_path none``) it refuses.
        locks_run: It holds the run directory's lock (:mod:`project.run_lock`) for the whole command.
        tracks: The ``tracking`` section's logger (MLflow) records it.
        tests_after: ``--test_after_fit`` (default on) tests the best checkpoint afterwards.
        stops_on_signal: A stop signal (SIGTERM, SIGUSR1) ends it at the same step on every rank, saved, exit 75.
        self_test: It is the layout's self-test: its own options and join timeout, nothing written but check.json.
        starts_ranks_early: The early layer may fork its CPU ranks right after the imports (not Lightning's launcher).
        runner: ``function(args)`` that runs a command which builds no Trainer.
        arguments: ``function(parser)`` adding the command's own options to its parser.
        settings: ``function(section, config) -> section`` adjusting the ``parallel`` section before it is resolved.
        trainer_kwargs: ``function(config, callbacks) -> dict``: a self-test's Trainer settings.
    """

    name: str
    help: str
    builds: Builds
    trainer_method: str | None = None
    trains: bool = False
    takes_checkpoint: bool = False
    evaluates: bool = False
    locks_run: bool = False
    tracks: bool = False
    tests_after: bool = False
    stops_on_signal: bool = False
    self_test: bool = False
    starts_ranks_early: bool = False
    runner: str | None = None
    arguments: str | None = None
    settings: str | None = None
    trainer_kwargs: str | None = None

    def __post_init__(self) -> None:
        """A row that contradicts itself is a programming error, caught at import."""
        runs = self.builds is Builds.TRAINER
        assert runs == (self.trainer_method is not None), self.name
        assert runs or not (self.trains or self.takes_checkpoint or self.starts_ranks_early), self.name
        assert not (self.evaluates and self.trains) and (self.takes_checkpoint or not self.evaluates), self.name
        assert (self.runner is not None) == (self.builds in (Builds.DRIVER, Builds.FILES)), self.name

    @property
    def builds_trainer(self) -> bool:
        """It builds a Trainer in every rank (it resolves the layout before anything is built)."""
        return self.builds is Builds.TRAINER

    @property
    def steps_optimizer(self) -> bool:
        """It runs optimizer steps (``Trainer.fit``): what cannot accumulate or shard is refused before it starts."""
        return self.trainer_method == "fit"


_EVALUATES = {"takes_checkpoint": True, "evaluates": True, "starts_ranks_early": True}
#: The core's commands; each layer adds its own rows (project/layers.py, a layer's ``commands``).
CORE_COMMANDS: tuple[Command, ...] = (
    Command(
        "fit",
        "train, validate, then test the best checkpoint",
        Builds.TRAINER,
        "fit",
        trains=True,
        takes_checkpoint=True,
        locks_run=True,
        tracks=True,
        tests_after=True,
        stops_on_signal=True,
        starts_ranks_early=True,
    ),
    Command("validate", "evaluate a checkpoint on the validation set", Builds.TRAINER, "validate", **_EVALUATES),
    Command("test", "evaluate a checkpoint on the test set", Builds.TRAINER, "test", **_EVALUATES),
    Command(
        "predict", "run predict_step over the predict set with a checkpoint", Builds.TRAINER, "predict", **_EVALUATES
    ),
    Command("plan", "resolve the parallel layout without training (--assume_gpus N, --json)", Builds.MODEL_AND_DATA),
)
# At the end of the module: a layer's rows are Command instances, so their layer.py imports this module first.
from project.layers import installed  # noqa: E402

#: Every command of this checkout: the core's, then each installed layer's.
COMMANDS: dict[str, Command] = {
    row.name: row for row in (*CORE_COMMANDS, *(row for layer in installed() for row in layer.commands))
}
USAGE = f"usage: python -m project {{{','.join(COMMANDS)}}} --config FILE [options]\n\n" + "".join(
    f"  {row.name:<11} {row.help}\n" for row in COMMANDS.values()
)


def command_of(args: Sequence[str]) -> Command | None:
    """The row of the command ``args`` start with; ``None`` when they start with none."""
    return COMMANDS.get(args[0]) if args else None


def split_command(args: list[str]) -> tuple[Command, list[str]]:
    """The command's row and its arguments; top-level ``--help`` prints the commands and exits (UserError: unknown)."""
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE + "\nEach command's options: python -m project COMMAND --help\n")
        raise SystemExit(0 if args else 2)
    if args[0] not in COMMANDS:
        raise UserError(f"unknown command {args[0]!r}; use one of {', '.join(COMMANDS)} (see python -m project --help)")
    return COMMANDS[args[0]], args[1:]


def answer_without_training_imports(args: list[str]) -> None:
    """Answer the top-level help and an unknown command here (exit); return for anything else."""
    # torch.distributed.launch's --local_rank is not the command (project.cli drops it again, and checks it)
    from project.launch.legacy import strip_legacy_local_rank

    rest = run_reporting_user_errors(lambda: strip_legacy_local_rank(args)[0])
    if not rest or rest[0] not in COMMANDS:
        run_reporting_user_errors(lambda: split_command(rest))
