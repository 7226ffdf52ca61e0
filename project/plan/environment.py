"""What launched us (a row of :mod:`project.plan.launchers`, else Lightning's launcher), and the layout it imposes."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from project.errors import UserError
from project.plan.launchers import LAUNCHERS, LEGACY_LAUNCH, RAY, TORCHRUN, detect_launcher, read_int, read_ints

LIGHTNING = "lightning"


@dataclass(frozen=True)
class LaunchEnvironment:
    """The launcher and the layout it imposes (``None`` where the launcher leaves it to us)."""

    launcher: str
    external: bool
    world_size: int | None = None
    local_world_size: int | None = None
    num_nodes: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    # torchrun only: --max-restarts, and whether the workers share the agent's rendezvous store.
    max_restarts: int | None = None
    agent_store: bool | None = None
    # Ray and Kubeflow: the Lightning ClusterEnvironment (import path) that reads this launcher's ranks.
    cluster_environment: str | None = None
    # RAY_ADDRESS: the Ray cluster a driver (parallel.launcher: ray) submits to; None starts a local one.
    address: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for plan.json."""
        return asdict(self)


def detect_environment(environ: Mapping[str, str] | None = None) -> LaunchEnvironment:
    """Read the launcher and its layout from environment variables."""
    env = os.environ if environ is None else environ
    common = {"master_addr": env.get("MASTER_ADDR"), "master_port": read_int(env, "MASTER_PORT")}
    common["address"] = env.get("RAY_ADDRESS") or None
    found = detect_launcher(env)
    if found is not None:
        row, fields = found
        return LaunchEnvironment(external=True, cluster_environment=row.cluster_environment, **fields, **common)
    # Lightning's launcher: the first process has no LOCAL_RANK; the ones it starts carry theirs.
    ranks = read_ints(env, world_size="WORLD_SIZE", rank="RANK", local_rank="LOCAL_RANK", node_rank="NODE_RANK")
    return LaunchEnvironment(launcher=LIGHTNING, external=False, **ranks, **common)


def refuse_missing_requirement(environment: LaunchEnvironment) -> None:
    """Refuse a launcher whose ranks Lightning reads through a module that is not installed (mpirun: mpi4py)."""
    row = next((row for row in LAUNCHERS if row.name == environment.launcher), None)
    if row is not None and row.requires and importlib.util.find_spec(row.requires) is None:
        raise UserError(
            f"{environment.launcher} started this process ({environment.world_size} ranks), and Lightning reads its "
            f"ranks through {row.requires}, which is not installed; `pip install {row.requires}`, or start the ranks "
            "with torchrun"
        )


def refuse_stray_rank(environment: LaunchEnvironment) -> None:
    """Refuse a ``RANK`` other than 0 that no launcher set: the process would drop every log as a non-zero rank."""
    if environment.launcher == LIGHTNING and environment.rank not in (None, 0) and environment.local_rank is None:
        raise UserError(
            f"RANK={environment.rank} is set in the environment, but no launcher started this process (no "
            "LOCAL_RANK, TORCHELASTIC_RUN_ID or SLURM job): it would run as rank "
            f"{environment.rank} and write no logs; `unset RANK`, or start the ranks with torchrun"
        )


def requested_launcher(asked: str, environment: LaunchEnvironment) -> LaunchEnvironment:
    """The environment a plan resolves against: the detected one, or under ``ray`` (outside a Ray worker) the driver's.

    Ray Train then starts the workers; SLURM's or Kubeflow's variables describe the Ray cluster, not this command.
    """
    refuse_missing_requirement(environment)
    if asked != RAY or environment.launcher == RAY:
        return environment
    if environment.launcher in (TORCHRUN, LEGACY_LAUNCH):
        raise UserError(
            f"parallel.launcher=ray in a process that {environment.launcher} started: every rank would submit its "
            "own Ray job; run `python -m project ...` once, without torchrun (Ray Train starts the workers), or "
            "drop parallel.launcher"
        )
    return LaunchEnvironment(launcher=RAY, external=True, address=environment.address)
