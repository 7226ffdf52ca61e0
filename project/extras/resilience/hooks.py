"""What the resilience layer plugs into the core (``layer.py`` names these): its callbacks and the elastic plan.

On every Trainer: the hang recorder (several processes: at a stall every rank's stacks in ``hang/``). On a
multi-process fit: straggler detection (the ``stragglers`` section) and, in an elastic torchrun job, the callback
that saves on a lost peer and records each size change. Around the plan of an elastic job: a restart keeps the
checkpoint's global batch, and a size its layout cannot hold ends the job in one line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from lightning import Callback

from project.commands import Command
from project.errors import UserError
from project.extras.resilience.elastic.callback import ElasticCallback
from project.extras.resilience.elastic.job import detect_elastic, end_job, keep_checkpoint_batch
from project.extras.resilience.hang import HangRecorder
from project.extras.resilience.stragglers import StragglerCallback
from project.extras.resilience.stragglers_config import stragglers_settings
from project.plan.config import ParallelConfig
from project.plan.environment import LaunchEnvironment, detect_environment
from project.run_state import RunState


def resilience_callbacks(state: RunState, row: Command, config: Any) -> list[Callback]:
    """The hang recorder; on a multi-process fit the straggler detection; in an elastic job its callback, last."""
    own: list[Callback] = [HangRecorder()]  # several processes: at a stall every rank's stacks in hang/
    settings = stragglers_settings(config.get("stragglers"))
    plan = state.built
    if row.trains and plan is not None and plan.world_size > 1 and settings.every_n_steps > 0:
        own.append(StragglerCallback(settings.every_n_steps, settings.factor))
    # The environment as torchrun set it (the node range is its agent's argument); last: it may end the rank.
    job = detect_elastic(detect_environment()) if row.trains and plan is not None else None
    return [*own, ElasticCallback(job)] if job is not None else own


@contextlib.contextmanager
def elastic_plan(
    section: ParallelConfig, environment: LaunchEnvironment, resuming: dict[str, Any] | None, row: Command
) -> Iterator[ParallelConfig]:
    """Around the plan of a fit in an elastic torchrun job (``--nnodes MIN:MAX``); elsewhere the section as it is.

    A restart at another size resumes the checkpoint's global batch and accumulation (``resuming``: the loaders'
    state in it). A size the layout cannot hold ends the whole job in one line: torchrun would restart workers
    that fail alike.
    """
    job = detect_elastic(environment) if row.trains else None
    if job is None:
        yield section
        return
    try:
        yield keep_checkpoint_batch(section, resuming, job)
    except UserError as error:
        end_job(f"{error} (elastic job {job.describe()}, now {environment.world_size} processes)")
