"""``torch.distributed.launch``, the legacy launcher: its ``--local_rank`` argument taken off the command line."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from project.errors import UserError

_LOCAL_RANK_ARG = re.compile(r"^--local[-_]rank(?:=(.*))?$")


def strip_legacy_local_rank(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[list[str], bool]:
    """``argv`` without ``--local-rank=N``/``--local_rank N`` (checked against ``LOCAL_RANK``); whether it had one."""
    env = os.environ if environ is None else environ
    cleaned: list[str] = []
    values: list[str] = []
    args = iter(argv)
    for arg in args:
        match = _LOCAL_RANK_ARG.match(arg)
        if not match:
            cleaned.append(arg)
        elif match.group(1) is not None:
            values.append(match.group(1))
        elif (value := next(args, None)) is not None:
            values.append(value)
        else:
            raise UserError(f"{arg} needs a value (e.g. {arg}=0)")
    for value in values:
        if not value.isdigit():
            raise UserError(f"--local_rank={value!r} must be a whole number >= 0")
        if (local_rank := env.get("LOCAL_RANK", value)) != value:
            raise UserError(
                f"--local_rank={value} disagrees with LOCAL_RANK={local_rank} set by the launcher; "
                "drop --local_rank and let the launcher set LOCAL_RANK"
            )
    return cleaned, bool(values)
