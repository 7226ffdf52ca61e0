"""The ``stragglers`` config section: how often each rank's compute time is gathered, and how slow is slow.

Pure: no Lightning, so every command's parser takes the section without importing it. The two options were flat
fields of ``parallel`` before (``parallel.straggler_every_n_steps``, ``parallel.straggler_factor``): the parser's
error for an old name says its new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from project.errors import UserError

#: The flat names of earlier versions -> their keys now: an old key's error says the new one.
MOVED_OPTIONS = {
    "parallel.straggler_every_n_steps": "stragglers.every_n_steps",
    "parallel.straggler_factor": "stragglers.factor",
}


@dataclass
class StragglersConfig:
    """The ``stragglers`` section: straggler detection on a multi-process fit (docs/extras/resilience.md).

    Args:
        every_n_steps: Gather each rank's compute time every N optimizer steps (0: off) and name a rank slower than
            the median of the others by ``factor``.
        factor: How many times the median step time of the other ranks a rank must take to be named a straggler.
    """

    every_n_steps: int = 50
    factor: float = 1.5


def add_stragglers_section(parser: Any) -> None:
    """The ``stragglers`` section, which every command's parser takes; the old flat names say where they went."""
    parser.add_argument(
        "--stragglers",
        type=StragglersConfig | None,
        default=None,
        help="Straggler detection on several processes (null: every 50 steps, factor 1.5; every_n_steps: 0 is off).",
    )
    parser.moved_options = {**parser.moved_options, **MOVED_OPTIONS}


def stragglers_settings(section: Any) -> StragglersConfig:
    """The parsed section (a Namespace, or ``None``: the defaults) as checked settings.

    Raises:
        UserError: a negative interval or a factor of 1 or less, in one line naming both.
    """
    values = {} if section is None else section.as_dict() if hasattr(section, "as_dict") else dict(section)
    settings = StragglersConfig(**values)
    if settings.every_n_steps < 0 or settings.factor <= 1:
        raise UserError(
            f"stragglers.every_n_steps={settings.every_n_steps} must be >= 0 (0: off) and "
            f"stragglers.factor={settings.factor} > 1 (times the median of the other ranks)"
        )
    return settings
