"""The ``nonfinite`` config section: what a nan or inf training loss does, and how often it is looked for.

Pure: no Lightning, so every command's parser takes the section without importing it. The layer adds
:class:`~.nonfinite.NonFiniteLossCallback` to every fit with these settings, unless the config's
``trainer.callbacks`` lists one of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from project.errors import UserError

ACTIONS = ("stop", "skip")


@dataclass
class NonFiniteConfig:
    """The ``nonfinite`` section: the non-finite loss check of every fit (docs/extras/guards.md).

    Args:
        action: ``stop``: end the run naming the step and rank(s), no checkpoint holding the bad update; ``skip``:
            drop that step's update (needs ``check_every_n_steps: 1``).
        check_every_n_steps: Look every N optimizer steps and before every save (no host sync per step when N > 1;
            up to N bad updates applied, never saved); 1: before every update; 0: off.
    """

    action: str = "stop"
    check_every_n_steps: int = 10


def add_nonfinite_section(parser: Any) -> None:
    """The ``nonfinite`` section, which every command's parser takes."""
    parser.add_argument(
        "--nonfinite",
        type=NonFiniteConfig | None,
        default=None,
        help="The non-finite loss check of every fit (null: action stop, every 10 steps; check_every_n_steps: 0 "
        "is off).",
    )


def nonfinite_settings(section: Any) -> NonFiniteConfig:
    """The parsed section (a Namespace, or ``None``: the defaults) as checked settings.

    Raises:
        UserError: an unknown action, a negative interval, or ``skip`` with an interval other than 1.
    """
    values = {} if section is None else section.as_dict() if hasattr(section, "as_dict") else dict(section)
    settings = NonFiniteConfig(**values)
    if settings.action not in ACTIONS or settings.check_every_n_steps < 0:
        raise UserError(
            f"nonfinite.action={settings.action!r} must be one of {', '.join(ACTIONS)} and "
            f"nonfinite.check_every_n_steps={settings.check_every_n_steps} >= 0 (0: off)"
        )
    if settings.action == "skip" and settings.check_every_n_steps not in (0, 1):
        raise UserError(
            f"nonfinite.action: skip needs nonfinite.check_every_n_steps: 1 (got {settings.check_every_n_steps}): a "
            "step's update can only be dropped before it is applied; use action: stop with N > 1"
        )
    return settings
