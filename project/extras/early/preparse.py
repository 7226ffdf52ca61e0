"""How many processes Lightning's launcher would start on this machine, read from the command line alone.

A cheap pre-parse (the standard library and PyYAML; no torch, no Lightning, no jsonargparse): the ``--config``
files merged left to right, as the parser merges them (a later file's ``parallel:`` fields replace the same
fields, ``parallel: null`` drops the section, a ``--parallel.X`` after it starts a fresh one), then the
``--parallel.X value`` overrides in their place. It answers only what it reads with certainty, and ``None``
(Lightning's launcher starts the ranks, as without it) for anything else: an outside launcher, an inline or
unreadable config, a field it does not know, GPUs that may be visible, several nodes, Ray. Rank 0 checks the
answer against the real plan (:meth:`.ranks.StartedRanks.confirm`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from project.commands import command_of
from project.plan.config import SUBSECTIONS, ParallelConfig
from project.plan.scenarios import AUTO_SCENARIO, SCENARIOS

#: ``PROJECT_EARLY_LAUNCH=0`` leaves starting the ranks to Lightning's launcher.
OPT_OUT_ENV = "PROJECT_EARLY_LAUNCH"
# Variables of a launcher that started this process (torchrun, SLURM, Ray, Kubeflow, MPI, LSF, Lightning's own
# children) or of a user who set the ranks by hand: the ranks are someone else's to start.
_LAUNCHED = (
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "RAY_RAYLET_PID",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "JSM_NAMESPACE_RANK",
)
_FIELDS = frozenset(field.name for field in fields(ParallelConfig))
# A subsection's field on the command line: --parallel.fsdp.sharding (it decides no process count).
_SUBFIELDS = frozenset(f"{name}.{field.name}" for name, kind in SUBSECTIONS.items() for field in fields(kind))
_NUMBER = re.compile(r"^\d+$")
_WORD = re.compile(r"^[a-z_]+$")


class Unreadable(Exception):
    """Something the pre-parse cannot read with certainty: Lightning's launcher starts the ranks."""


class _Given(str):
    """A value as written on the command line (the parser reads it as YAML; only plain words and numbers are read)."""


def processes_to_start(
    argv: Sequence[str], environ: Mapping[str, str] | None = None, gpus_possible: bool | None = None
) -> int | None:
    """The processes to start on this machine for ``python -m project ARGV``, when it is sure; else ``None``.

    Args:
        argv: The command line after ``python -m project``.
        environ: The environment (default ``os.environ``).
        gpus_possible: Whether a GPU may be visible (default: looked up in ``/dev`` and ``CUDA_VISIBLE_DEVICES``).

    Returns:
        N > 1 for a ``parallel`` section of N CPU processes on one node started by Lightning's launcher; ``None``
        for one process, another launcher, GPUs, or anything the pre-parse cannot read with certainty.
    """
    env = os.environ if environ is None else environ
    if env.get(OPT_OUT_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return None
    # fork and the parent-death signal are Linux's; an interactive interpreter would run on after the command.
    command = command_of(argv)  # a command that builds a Trainer (plan starts no process, consolidate no Trainer)
    if sys.platform != "linux" or sys.flags.interactive or command is None or not command.starts_ranks_early:
        return None
    if any(key in env for key in _LAUNCHED) or any(key.startswith("JSONARGPARSE_") for key in env):
        return None  # JSONARGPARSE_*: the parser may read options from the environment
    try:
        section = parallel_section(argv[1:])
        return _count(section, _gpus_possible(env) if gpus_possible is None else gpus_possible)
    except (Unreadable, OSError, yaml.YAMLError, RecursionError):
        return None


def parallel_section(args: Sequence[str]) -> dict[str, Any] | None:
    """The ``parallel`` section the parser would build from ``args`` (after the command); ``None`` if none or null.

    Raises:
        Unreadable: an option the pre-parse cannot follow (help, ``--print_config``, an inline ``--parallel``,
            an unknown field, a config that is not a file).
    """
    section: dict[str, Any] | None = None
    i = 0
    while i < len(args):
        name, equals, inline = args[i].partition("=")
        followed = name in ("-c", "--config", "--parallel") or name.startswith("--parallel.")
        if name in ("-h", "--help") or (name.startswith(("--print_config", "--conf", "--parallel")) and not followed):
            raise Unreadable(name)  # prints and exits, or an abbreviation the parser may expand
        if not followed:
            i += 1
            continue
        if equals:
            value, i = inline, i + 1
        elif i + 1 < len(args):
            value, i = args[i + 1], i + 2
        else:
            raise Unreadable(f"{name} without a value")
        if name in ("-c", "--config"):
            section = _merge_file(section, value)
        elif name == "--parallel":
            raise Unreadable("a whole section on the command line")
        else:
            key = name.removeprefix("--parallel.")
            if key not in _FIELDS | _SUBFIELDS:
                raise Unreadable(f"parallel.{key}")
            section = {**(section or {}), key: _Given(value)}
    return section


def _merge_file(section: dict[str, Any] | None, value: str) -> dict[str, Any] | None:
    """``section`` after the config file ``value``: its ``parallel:`` fields over the ones before."""
    path = Path(value)
    if not path.is_file():
        raise Unreadable(f"--config {value!r} is not a file")  # inline YAML/JSON, or missing (refused later)
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or "config" in data or any(str(key).startswith("parallel.") for key in data):
        raise Unreadable(f"{value}: not a plain mapping of sections")
    if "parallel" not in data:
        return section
    given = data["parallel"]
    if given is None:
        return None
    if not isinstance(given, dict) or not set(map(str, given)) <= _FIELDS:
        raise Unreadable(f"{value}: parallel is not a mapping of known fields")
    return {**(section or {}), **given}


def _word(value: Any) -> str:
    if isinstance(value, _Given) and not _WORD.match(value):
        raise Unreadable(value)
    if not isinstance(value, str):
        raise Unreadable(repr(value))
    return str(value)


def _number(value: Any) -> int | None:
    """A count as the parser reads it: an int, digits, or null; anything else is not read."""
    if value is None or (isinstance(value, _Given) and value == "null"):
        return None
    if isinstance(value, str) and _NUMBER.match(value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise Unreadable(repr(value))


def _count(section: dict[str, Any] | None, gpus_possible: bool) -> int | None:
    """N CPU processes on one node under Lightning's launcher (``launcher: auto``), else ``None``."""
    if section is None:
        return None  # no section: plain Lightning trainer settings, which this does not read
    scenario = _word(section.get("scenario", "auto"))
    launcher = _word(section.get("launcher", "auto"))
    nodes, devices = _number(section.get("num_nodes")), _number(section.get("devices"))
    if launcher != "auto" or nodes not in (None, 1) or devices is None or devices < 2:
        return None
    # A cpu scenario runs CPU processes on any machine; auto and an "any" scenario do only where no GPU is visible
    # (then the GPUs decide). A scenario whose strategy forks its ranks itself is left to it.
    row = SCENARIOS.get(scenario)
    devices_kind = "any" if scenario == AUTO_SCENARIO else row.devices if row is not None else None
    if row is not None and row.forks_itself:
        return None
    if devices_kind == "cpu" or (devices_kind == "any" and not gpus_possible):
        return devices
    return None


def _gpus_possible(environ: Mapping[str, str]) -> bool:
    """Whether torch may see a GPU here, without importing torch: a GPU device node, unless hidden."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    dev = Path("/dev")
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists() or (dev / "dxg").exists()
