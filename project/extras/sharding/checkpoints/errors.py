"""Why a sharded checkpoint did not load, in one line: refused by the pickle policy, damaged, or not this model's.

DCP wraps what failed on each rank into a ``CheckpointException``; these helpers dig out the real cause so the
user reads the rank's own error, and tell a refusal or damage ("incomplete or corrupt") apart from a sound
checkpoint whose keys or shapes are not those of the model and optimizers ("does not fit").
"""

from __future__ import annotations

import pickle
from pathlib import Path

from torch.distributed.checkpoint import CheckpointException

from project.checkpoints.loading import ALLOW_PICKLE_ENV
from project.errors import UserError

#: What a DCP load raises: any error, or its CheckpointException (a BaseException that gathers every rank's failure).
LOAD_ERRORS = (Exception, CheckpointException)


def causes(error: BaseException) -> list[BaseException]:
    """``error``, what caused it, and what failed on each rank (DCP gathers those into a CheckpointException)."""
    found: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if not isinstance(current, BaseException) or any(current is seen for seen in found):
            continue
        found.append(current)
        failures = getattr(current, "failures", None)
        todo += [current.__cause__, current.__context__]
        for failure in failures.values() if isinstance(failures, dict) else []:
            todo.append(failure[0] if isinstance(failure, tuple) else failure)  # (exception, traceback)
    return found


def _reason(error: BaseException) -> str:
    """The first line of what really failed (a rank's error rather than DCP's CheckpointException around it)."""
    found = [e for e in causes(error) if not isinstance(e, CheckpointException)] or [error]
    text = (str(found[0]).strip().splitlines() or [type(found[0]).__name__])[0].rstrip(".")
    return text if len(text) <= 300 else text[:297] + "..."


def unsafe_error(path: Path, error: BaseException) -> UserError:
    """One line for a sharded checkpoint that did not load: refused by the pickle policy, or damaged."""
    found = causes(error)
    refused = next((e for e in found if isinstance(e, UserError)), None)
    if refused is not None:
        return refused
    if any(isinstance(e, pickle.UnpicklingError) for e in found):
        return UserError(
            f"'{path}' holds pickled objects beyond tensors and plain containers, which only arbitrary code can "
            f"load, so weights_only=True refuses them; if you trust the checkpoint, rerun with {ALLOW_PICKLE_ENV}=1"
        )
    return UserError(f"sharded checkpoint '{path}' is incomplete or corrupt and cannot be loaded ({_reason(error)})")


def misfit_error(path: Path, error: BaseException) -> UserError:
    """One line for a sound checkpoint whose keys or shapes are not those of the model and optimizers."""
    return UserError(
        f"checkpoint '{path}' does not fit this model or its optimizer ({_reason(error)}); load it with the "
        "model and optimizer configuration that wrote it"
    )
