"""A job submitted elsewhere: ``parallel.launcher`` names a launcher that did not start this process (``ray``).

This process then plans as usual and a layer submits the same command to that launcher's workers, and waits.
"""

from __future__ import annotations

from collections.abc import Callable

from project.errors import UserError
from project.layers import hooks
from project.plan.environment import LaunchEnvironment

AUTO = "auto"  # parallel.launcher: whichever launcher started the processes (Lightning's, torchrun, SLURM, ...)


def submitter(asked: str, environment: LaunchEnvironment) -> Callable[..., None] | None:
    """A layer's way to submit the job to ``asked``, ``fn(argv, command, plan, run_in_worker)``; ``None``: run here."""
    if asked in (AUTO, environment.launcher):
        return None
    for submits in hooks("submit"):
        if (run := submits(asked)) is not None:
            return run
    raise UserError(
        f"parallel.launcher={asked} needs the {asked} layer (project/extras/{asked}), which this checkout does not "
        "have; drop parallel.launcher (Lightning's launcher, torchrun or SLURM start the processes)"
    )
