"""The space file of ``python -m project sweep --sweep FILE``: what to optimise, over which config keys, how to prune.

Read and checked here, before anything else happens (standard library and PyYAML only): a mistake is one line
naming the file, the entry and the rule (:class:`~project.errors.UserError`, exit code 2). Whether the base config
takes each key is asked of the real parser afterwards (:mod:`project.extras.sweep.setup`).
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from project.errors import UserError

TOP_KEYS = ("metric", "direction", "n_trials", "seed", "parameters", "fixed", "pruner")
DIRECTIONS = ("maximize", "minimize")
#: The keys each parameter type takes (``type`` included).
PARAMETER_KEYS = {
    "float": ("type", "low", "high", "log", "step"),
    "int": ("type", "low", "high", "log", "step"),
    "categorical": ("type", "choices"),
}
PRUNERS = ("median", "none")
PRUNER_KEYS = ("type", "n_startup_trials", "n_warmup_steps", "interval_steps")
#: Config keys the driver sets on every trial itself: a space file may not set them.
RESERVED = ("config", "trainer.logger", "resume", "ckpt_path", "tracking.tags", "print_config", "help")
# A dotted config key; `+` at the end appends to a list (`trainer.callbacks+`), as on the command line.
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\+?$")


@dataclass(frozen=True)
class Parameter:
    """One searched config key and its distribution."""

    key: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def distribution(self) -> Any:
        """The Optuna distribution (Optuna is imported here, by the driver only)."""
        from optuna import distributions

        if self.type == "categorical":
            return distributions.CategoricalDistribution(list(self.choices))
        if self.type == "float":
            return distributions.FloatDistribution(self.low, self.high, log=self.log, step=self.step)
        return distributions.IntDistribution(self.low, self.high, log=self.log, step=self.step or 1)

    def example(self) -> Any:
        """A value of the space, for checking the key against the base config before any trial."""
        return self.choices[0] if self.type == "categorical" else self.low


@dataclass(frozen=True)
class PrunerSettings:
    """Optuna's median pruner (``type: median``) or none: its settings travel to the trial in its environment."""

    type: str = "median"
    n_startup_trials: int = 2
    n_warmup_steps: int = 0
    interval_steps: int = 1

    def build(self) -> Any:
        """The Optuna pruner."""
        from optuna import pruners

        if self.type == "none":
            return pruners.NopPruner()
        return pruners.MedianPruner(self.n_startup_trials, self.n_warmup_steps, self.interval_steps)

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain data."""
        return asdict(self)


@dataclass(frozen=True)
class Space:
    """A checked space file."""

    path: Path
    parameters: tuple[Parameter, ...]
    metric: str | None = None
    direction: str | None = None
    n_trials: int = 10
    seed: int | None = None
    fixed: dict[str, Any] = field(default_factory=dict)
    pruner: PrunerSettings = PrunerSettings()

    def distributions(self) -> dict[str, Any]:
        """Parameter key -> Optuna distribution, for ``study.ask``."""
        return {parameter.key: parameter.distribution() for parameter in self.parameters}


def read_space(path: str | Path) -> Space:
    """Read and check the space file at ``path``.

    Raises:
        UserError: an unreadable file, an unknown or missing entry, a bad range or key; one line.
    """
    path = Path(path)
    data = _load(path)
    say = _Sayer(path)
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise say(f"unknown entr{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; use {', '.join(TOP_KEYS)}")
    parameters = data.get("parameters")
    if not isinstance(parameters, dict) or not parameters:
        raise say("`parameters` is missing or empty; give each searched config key with its type and range")
    fixed = data.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise say("`fixed` must map config keys to the values every trial gets")
    for key in fixed:
        _check_key(say, "fixed", key, append_allowed=True)
    both = sorted(set(fixed) & set(parameters))
    if both:
        raise say(f"{', '.join(both)} is both searched (parameters) and fixed; keep it in one place")
    direction = data.get("direction")
    if direction is not None and direction not in DIRECTIONS:
        raise say(f"direction: {direction!r} must be one of {', '.join(DIRECTIONS)}")
    metric = data.get("metric")
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise say(f"metric: {metric!r} must be the name of a logged metric, e.g. val/acc")
    return Space(
        path=path,
        parameters=tuple(_parameter(say, key, spec) for key, spec in parameters.items()),
        metric=metric,
        direction=direction,
        n_trials=_count(say, "n_trials", data.get("n_trials", 10), low=1),
        seed=None if data.get("seed") is None else _count(say, "seed", data["seed"], low=0),
        fixed=dict(fixed),
        pruner=_pruner(say, data.get("pruner")),
    )


class _Sayer:
    """Makes the one-line error of a space file: ``<file>: <problem>``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, problem: str) -> UserError:
        return UserError(f"sweep space {self.path}: {problem}")


def _load(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise UserError(f"cannot read the sweep space {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise UserError(f"sweep space {path} is not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(data, dict):
        raise UserError(f"sweep space {path}: expected a mapping with `parameters:` (see docs/extras/sweep.md)")
    return data


def _check_key(say: _Sayer, section: str, key: Any, append_allowed: bool = False) -> None:
    if not isinstance(key, str) or not _DOTTED.match(key) or (key.endswith("+") and not append_allowed):
        raise say(f"{section}: {key!r} is not a dotted config key such as optimizer.init_args.lr")
    bare = key.rstrip("+")
    owned = next((r for r in RESERVED if bare == r or bare.startswith(r + ".")), None)
    if owned is not None:
        raise say(f"{section}: {key} is set by the sweep itself on every trial ({owned}); leave it out")


def _parameter(say: _Sayer, key: Any, spec: Any) -> Parameter:
    _check_key(say, "parameters", key)
    where = f"parameters.{key}"
    if not isinstance(spec, dict) or "type" not in spec:
        raise say(f"{where}: missing `type` (one of {', '.join(PARAMETER_KEYS)})")
    kind = spec["type"]
    if kind not in PARAMETER_KEYS:
        raise say(f"{where}: unknown type {kind!r}; use one of {', '.join(PARAMETER_KEYS)}")
    unknown = sorted(set(spec) - set(PARAMETER_KEYS[kind]))
    if unknown:
        raise say(f"{where}: {', '.join(map(str, unknown))} is not a setting of type {kind}")
    if kind == "categorical":
        return Parameter(key, kind, choices=_choices(say, where, spec.get("choices")))
    low, high = (_number(say, where, spec, end, kind) for end in ("low", "high"))
    if low >= high:
        raise say(f"{where}: low {low} must be below high {high}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise say(f"{where}: log must be true or false")
    if log and low <= 0:
        raise say(f"{where}: a log scale needs low > 0 (got {low})")
    step = _number(say, where, spec, "step", kind) if spec.get("step") is not None else None
    if step is not None and (step <= 0 or log):
        raise say(f"{where}: step must be > 0, and cannot go with log: true")
    return Parameter(key, kind, low, high, log, step)


def _number(say: _Sayer, where: str, spec: dict[str, Any], name: str, kind: str) -> float | int:
    if name not in spec:
        raise say(f"{where}: missing `{name}` (type {kind} takes low and high)")
    value = spec[name]
    if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise say(f"{where}: {name} {value!r} must be an integer (type int)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise say(f"{where}: {name} {value!r} must be a finite number")
    return value if kind == "int" else float(value)


def _choices(say: _Sayer, where: str, choices: Any) -> tuple[Any, ...]:
    if not isinstance(choices, list) or not choices:
        raise say(f"{where}: missing `choices` (a non-empty list) for type categorical")
    bad = [c for c in choices if c is not None and not isinstance(c, (bool, int, float, str))]
    if bad:
        raise say(f"{where}: choice {bad[0]!r} must be a number, a string, true/false or null")
    if len({repr(c) for c in choices}) < len(choices):
        raise say(f"{where}: choices repeat a value")
    return tuple(choices)


def _count(say: _Sayer, name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise say(f"{name}: {value!r} must be an integer >= {low}")
    return value


def _pruner(say: _Sayer, data: Any) -> PrunerSettings:
    if data is None:
        return PrunerSettings()
    if not isinstance(data, dict):
        raise say("pruner must be a mapping such as {type: median, n_startup_trials: 2}")
    unknown = sorted(set(data) - set(PRUNER_KEYS))
    if unknown:
        raise say(f"pruner: unknown setting {', '.join(map(str, unknown))}; use {', '.join(PRUNER_KEYS)}")
    kind = data.get("type", "median")
    if kind not in PRUNERS:
        raise say(f"pruner: unknown type {kind!r}; use one of {', '.join(PRUNERS)}")
    counts = {name: _count(say, f"pruner.{name}", data[name], low=0) for name in PRUNER_KEYS[1:] if name in data}
    if counts.get("interval_steps") == 0:
        raise say("pruner.interval_steps must be >= 1")
    return PrunerSettings(type=kind, **counts)
