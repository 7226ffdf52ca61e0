"""An elastic torchrun job (``--nnodes MIN:MAX``): its node range, and the global batch a restart keeps.

torchrun tells its workers the world they are in now (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) but not the range of
nodes the job may run on: that is an argument of the agent, the worker's parent (``--nnodes 1:2``, or ``PET_NNODES``
in the agent's environment, which the workers inherit). When a node is lost or joins, the agents restart their
workers at the new size, and the command runs again with ``--resume auto``; the plan then takes the world size from
the environment (``WORLD_SIZE / LOCAL_WORLD_SIZE`` nodes) and, here, the global batch and accumulation from the
checkpoint it resumes, so that the data order and the result go on as if nothing happened.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from project.plan.config import ParallelConfig
from project.plan.environment import LaunchEnvironment
from project.plan.launchers import TORCHRUN, read_int


@dataclass(frozen=True)
class ElasticJob:
    """A torchrun job whose node count may change: its range and this attempt's restart count."""

    min_nodes: int
    max_nodes: int
    #: ``TORCHELASTIC_RESTART_COUNT``: how many times the agent restarted its workers (failures only).
    restart_count: int
    run_id: str

    def describe(self) -> str:
        """``--nnodes 1:2`` as the user wrote it."""
        return f"--nnodes {self.min_nodes}:{self.max_nodes}"


def nnodes_argument(argv: Sequence[str]) -> str | None:
    """The value of torchrun's ``--nnodes`` in the agent's command line (``None``: not given)."""
    # After the launcher itself (``torchrun``, ``python -m torch.distributed.run``), up to the worker's module.
    names = [i for i, arg in enumerate(argv) if arg.endswith("torchrun") or arg.startswith("torch.distributed.")]
    start = names[0] + 1 if names else 0
    for index in range(start, len(argv)):
        arg = argv[index]
        if arg in ("-m", "--module"):
            break
        if arg == "--nnodes" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--nnodes="):
            return arg.split("=", 1)[1]
    return None


def _agent_argv(ppid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{ppid}/cmdline").read_bytes()
    except OSError:  # not Linux, or the agent is gone
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def parse_range(value: str | None) -> tuple[int, int] | None:
    """``"1:2"`` -> (1, 2), ``"2"`` -> (2, 2); ``None`` for anything else (torchrun refused it already)."""
    if not value:
        return None
    parts = value.split(":")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        return None
    low, high = int(parts[0]), int(parts[-1])
    return (low, high) if 0 < low <= high else None


def detect_elastic(
    environment: LaunchEnvironment, environ: Mapping[str, str] | None = None, ppid: int | None = None
) -> ElasticJob | None:
    """The elastic job this process is a worker of; ``None`` outside torchrun or at a fixed node count."""
    env = os.environ if environ is None else environ
    if environment.launcher != TORCHRUN:
        return None
    found = parse_range(env.get("PET_NNODES")) or parse_range(nnodes_argument(_agent_argv(ppid or os.getppid())))
    if found is None or found[0] == found[1]:
        return None
    return ElasticJob(found[0], found[1], read_int(env, "TORCHELASTIC_RESTART_COUNT") or 0, env.get(
        "TORCHELASTIC_RUN_ID", ""))  # fmt: skip


def keep_checkpoint_batch(
    settings: ParallelConfig, resuming: dict[str, Any] | None, job: ElasticJob | None
) -> ParallelConfig:
    """Under an elastic job, the global batch and accumulation of the checkpoint a restart resumes.

    The world size changed, so the loader's batch size alone would make another global batch (and the resume would
    be refused); the per-process batch follows instead: global batch / (processes x accumulation). Values the
    config sets are left as they are (a disagreement is then refused in one line, as on any resume).
    """
    if job is None or not resuming or resuming.get("global_batch_size") is None:
        return settings
    if settings.global_batch_size is not None or settings.per_device_batch_size is not None:
        return settings
    if settings.micro_batch is not None or settings.accumulation is not None:
        return settings
    return replace(
        settings,
        global_batch_size=int(resuming["global_batch_size"]),
        accumulation=int(resuming.get("accumulation", 1)),
    )


def end_job(message: str, code: int = 2, say: bool | None = None) -> NoReturn:
    """End the whole elastic job on this node in one line: torchrun would restart workers that cannot run.

    Local rank 0 says ``error: <message>`` and ends the agent (SIGKILL: on SIGTERM it would print a traceback; its
    workers end with it, by the parent-death signal of :mod:`project.launch.orphans`); the other local ranks end
    quietly. ``say`` chooses the rank that speaks instead. Every node that reaches this ends the same way, so
    nothing of the job is left running.
    """
    if say if say is not None else os.environ.get("LOCAL_RANK", "0") == "0":
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()
        os.kill(os.getppid(), signal.SIGKILL)
    else:
        time.sleep(5.0)  # ended with the agent meanwhile: exiting first would make it restart the workers
    os._exit(code)
