"""The commands of ``python -m project`` and the answers that need no training imports.

``python -m project``, ``--help`` and an unknown command are answered here, before Lightning (about 5 s to import
on 2 cores) is imported: :mod:`project.__main__` asks :func:`answer_without_training_imports` first.
"""

from __future__ import annotations

import sys

from project.errors import UserError, run_reporting_user_errors

COMMANDS = {
    "fit": "train, validate, then test the best checkpoint",
    "validate": "evaluate a checkpoint on the validation set",
    "test": "evaluate a checkpoint on the test set",
    "predict": "write predictions.csv for a checkpoint",
    "plan": "resolve the parallel layout without training (--assume_gpus N, --json)",
    "check": "self-test the layout: ranks, collectives, bandwidth, invariance, step time (check.json)",
    "consolidate": "merge a sharded (fsdp) checkpoint folder into one plain file (CKPT_DIR [--out FILE])",
    "sweep": "search hyperparameters on Optuna, each trial a fit (--sweep configs/sweeps/FILE.yaml)",
}
USAGE = (
    "usage: python -m project {fit,validate,test,predict,plan,check,consolidate,sweep} --config FILE [options]\n\n"
    + "".join(f"  {name:<11} {what}\n" for name, what in COMMANDS.items())
)


def split_command(args: list[str]) -> tuple[str, list[str]]:
    """The command and its arguments; top-level ``--help`` prints the commands and exits.

    Raises:
        UserError: an unknown command.
    """
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE + "\nEach command's options: python -m project COMMAND --help\n")
        raise SystemExit(0 if args else 2)
    if args[0] not in COMMANDS:
        raise UserError(f"unknown command {args[0]!r}; use one of {', '.join(COMMANDS)} (see python -m project --help)")
    return args[0], args[1:]


def answer_without_training_imports(args: list[str]) -> None:
    """Answer the top-level help and an unknown command here (exit); return for anything else."""
    # torch.distributed.launch's --local_rank is not the command (project.cli drops it again, and checks it)
    from project.launch.legacy import strip_legacy_local_rank

    rest = run_reporting_user_errors(lambda: strip_legacy_local_rank(args)[0])
    if not rest or rest[0] not in COMMANDS:
        run_reporting_user_errors(lambda: split_command(rest))
