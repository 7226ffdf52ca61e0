"""How ``check`` differs from ``fit``: its options, a short timeout, a Trainer that writes only check.json."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from jsonargparse import ActionYesNo
from lightning.pytorch.cli import LightningArgumentParser

from project.errors import UserError
from project.extras.check.callback import WARMUP_STEPS, SelfCheckCallback, drill
from project.extras.check.hang_drill import HangDrill

#: The check's own options: never part of a training config.
OPTIONS = ("out", "join_timeout_s", "steps", "hang_drill")


def add_check_arguments(parser: LightningArgumentParser) -> None:
    """``--out``, ``--join_timeout_s``, ``--steps`` and ``--hang_drill``."""
    parser.add_argument("--out", type=str, default="check.json", help="Where to write the report (rank 0).")
    parser.add_argument(
        "--join_timeout_s",
        type=float,
        default=60.0,
        help="Seconds to wait for a rank that does not join or does not answer before naming it "
        "(the check's process-group timeout).",
    )
    parser.add_argument("--steps", type=int, default=20, help="Timed training steps on the configured model and data.")
    parser.add_argument(
        "--hang_drill",
        "--hang-drill",
        action=ActionYesNo,
        default=False,
        help="Stall the last rank on purpose to show the line a real stall ends with, after --join_timeout_s, "
        "and the hang report (hang/ beside --out) where the resilience layer is installed.",
    )


def check_settings(section: Any, config: Any) -> Any:
    """A rank that does not answer is named after the check's short ``--join_timeout_s``, not the run's timeout."""
    return replace(section, timeout_s=min(section.timeout_s, config.join_timeout_s))


def check_trainer_kwargs(config: Any, own: list[Any]) -> dict[str, Any]:
    """Trainer arguments for the check: a few steps, no validation, no logger, no checkpoints, no config file.

    ``own`` are the template callbacks the check keeps (the loader guarantees, compile) and the layers' (the hang
    recorder): the run's layout and sampling are what is checked, its checkpoints and records are not wanted. The
    report's folder is the Trainer's root: a layer that writes beside the run (``hang/``) writes beside the report.
    """
    if config.steps < 1 or config.join_timeout_s <= 0:
        raise UserError(f"--steps={config.steps} must be >= 1 and --join_timeout_s={config.join_timeout_s} > 0")
    if drill("exit"):
        os._exit(3)  # the fire drill: this rank never joins
    folder = Path(config.out).parent  # a stall in the check itself is reported like one in fit: beside the report
    drills = [HangDrill(WARMUP_STEPS + 1, folder, config.join_timeout_s)] if config.hang_drill else []
    return {
        "callbacks": [*own, SelfCheckCallback(config.out, config.join_timeout_s, config.steps), *drills],
        "default_root_dir": str(folder),
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "max_steps": WARMUP_STEPS + config.steps,
        "max_epochs": -1,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
    }
