"""The base config checked against the space once, before any trial: the keys it takes, the metric, the logger.

The driver imports no Lightning, so it asks the real parser in a subprocess: ``python -m project fit <base configs>
<fixed overrides> <each parameter at one of its values> --print_config`` parses everything a trial will be given
(an unknown key, a value of the wrong type: one line, exit code 2) and prints the merged config without building
anything. From that config come the defaults the space file may leave out: the metric and direction of the config's
monitored checkpoint (``BestCheckpoint(monitor=val/acc, mode=max)``), and whether tracking is on. The result is kept
in the study (:class:`Setup`), so continuing a study with the same files skips the check. The check's process, like
every trial's, dies with the driver (:func:`dies_with_driver`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from project.errors import UserError
from project.extras.sweep.space import Space
from project.launch.orphans import die_with_parent

#: Seconds the parse may take (it imports Lightning: about 5 s on 2 cores).
CHECK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Setup:
    """What the trials of a study are run with, decided once: base configs, metric, direction, tracking tags."""

    configs: tuple[str, ...]
    fingerprint: str
    metric: str
    direction: str
    tracking: bool = False
    #: Whether the base config names the MLflow experiment (else the trials log to one named after the study).
    experiment_named: bool = False

    @property
    def maximize(self) -> bool:
        """Whether a larger metric is better."""
        return self.direction == "maximize"

    def as_dict(self) -> dict[str, Any]:
        """Plain data, for the study's user attributes."""
        return {**asdict(self), "configs": list(self.configs)}

    @classmethod
    def from_dict(cls, data: Any) -> Setup | None:
        """The setup a study stored; ``None`` when it stored none."""
        if not isinstance(data, dict):
            return None
        return cls(**{**data, "configs": tuple(data["configs"])})


def config_args(configs: list[str]) -> list[str]:
    """``--config A --config B``: the base configs as every trial is given them."""
    return [word for config in configs for word in ("--config", config)]


def override_args(values: dict[str, Any]) -> list[str]:
    """``--key=value`` for each key, the value written as the parser reads it (JSON for lists and mappings)."""
    return [f"--{key}={format_value(value)}" for key, value in values.items()]


def format_value(value: Any) -> str:
    """One value on the command line: YAML's true/false/null, numbers as Python writes them, JSON for the rest."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value)


def fingerprint(configs: list[str], space: Space) -> str:
    """A digest of the base configs' and the space file's contents: unchanged files need no second check."""
    digest = hashlib.sha256()
    for path in [*configs, str(space.path)]:
        digest.update(path.encode() + b"\0")
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
    return digest.hexdigest()


def check_setup(configs: list[str], space: Space) -> Setup:
    """Parse what the trials will be given with the real parser; the metric, direction and tracking it implies.

    Raises:
        UserError: a key or value the base config does not take, no logger, or no metric to optimise.
    """
    examples = {parameter.key: parameter.example() for parameter in space.parameters}
    command = [sys.executable, "-m", "project", "fit", *config_args(configs), *override_args(space.fixed)]
    command += [*override_args(examples), "--print_config"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False, preexec_fn=dies_with_driver()
    )
    if done.returncode != 0:
        said = last_line(done.stderr).removeprefix("error: ")
        raise UserError(f"sweep space {space.path}: the base config does not take the sweep's keys: {said}")
    merged = yaml.safe_load(done.stdout)
    if not isinstance(merged, dict):
        raise UserError(f"sweep space {space.path}: could not read the merged config that `fit --print_config` printed")
    _need_a_logger(merged)
    metric, direction = _objective(merged, space)
    tracking = merged.get("tracking")
    on = isinstance(tracking, dict) and tracking.get("logger") not in (None, "none") and "tags" in tracking
    named = on and bool(tracking.get("experiment"))
    return Setup(tuple(configs), fingerprint(configs, space), metric, direction, on, named)


def dies_with_driver() -> Callable[[], None] | None:
    """A ``preexec_fn``: in the child, before exec, ask the kernel to kill it when the driver dies (any death).

    Linux's parent-death signal (:func:`project.launch.orphans.die_with_parent`); it survives ``exec`` and is sent
    when the driver's thread that started the child ends, so the driver starts its children from its main thread.
    ``None`` on Windows, which has no ``preexec_fn``.
    """
    return partial(die_with_parent, os.getpid()) if os.name == "posix" else None


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (a run's one-line error, or the last line of its traceback)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _need_a_logger(merged: dict[str, Any]) -> None:
    """Each trial gets its own run folder through the logger's save_dir and name: the base must name a logger."""
    logger = (merged.get("trainer") or {}).get("logger")
    args = logger.get("init_args") if isinstance(logger, dict) else None
    if not isinstance(args, dict) or "save_dir" not in args or "name" not in args:
        raise UserError(
            "a sweep gives each trial its own run folder through trainer.logger's save_dir and name, but the base "
            "config names no such logger; add one (configs/digits.yaml's TensorBoardLogger) to a --config file"
        )


def _objective(merged: dict[str, Any], space: Space) -> tuple[str, str]:
    """The metric and direction: the space file's, else those of the config's monitored checkpoint."""
    monitors: list[tuple[str, str]] = []
    for callback in (merged.get("trainer") or {}).get("callbacks") or []:
        args = callback.get("init_args") if isinstance(callback, dict) else None
        if isinstance(args, dict) and args.get("monitor"):
            monitors.append((str(args["monitor"]), str(args.get("mode") or "min")))
    metric = space.metric or (monitors[0][0] if monitors else None)
    if metric is None:
        raise UserError(
            f"sweep space {space.path}: the base config monitors no metric; give `metric:` (e.g. val/acc) and "
            "`direction:` (maximize or minimize)"
        )
    if space.direction is not None:
        return metric, space.direction
    mode = next((mode for name, mode in monitors if name == metric), None)
    if mode is None:
        raise UserError(f"sweep space {space.path}: no callback monitors {metric}; give `direction:` for it")
    return metric, "maximize" if mode == "max" else "minimize"
