"""A job submitted elsewhere: ``parallel.launcher`` names a launcher that did not start this process (``ray``).

This process is then the driver: it checks and plans as under any launcher, and a layer submits the same command to
that launcher's workers and waits; inside a worker the command runs as under any launcher.
"""

from __future__ import annotations

from collections.abc import Callable

from project.errors import UserError
from project.layers import hooks
from project.plan.environment import LaunchEnvironment

#: ``parallel.launcher``'s value for "whichever launcher started the processes" (Lightning's, torchrun, SLURM, ...).
AUTO = "auto"


def submitter(asked: str, environment: LaunchEnvironment) -> Callable[..., None] | None:
    """How this process submits the job to the launcher ``asked`` (a layer's ``submit`` hook); ``None``: it runs here.

    The function returned takes ``(argv, command, plan, run_in_worker)`` and waits for the job.

    Raises:
        UserError: no installed layer submits to ``asked`` (its layer was stripped), before anything is built.
    """
    if asked in (AUTO, environment.launcher):
        return None
    for submits in hooks("submit"):
        if (run := submits(asked)) is not None:
            return run
    raise UserError(
        f"parallel.launcher={asked} needs the {asked} layer (project/extras/{asked}), which this checkout does not "
        "have; drop parallel.launcher (Lightning's launcher, torchrun or SLURM start the processes)"
    )
