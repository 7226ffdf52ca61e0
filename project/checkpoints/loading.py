"""Loading files from outside: ``weights_only=True`` unless the user vouches, every failure one line; no Lightning."""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from project.checkpoints import pending
from project.checkpoints.formats import format_of, incomplete
from project.dotted import module_of, within
from project.errors import UserError, first_line

ALLOW_PICKLE_ENV = "PROJECT_ALLOW_PICKLE"  # set to 1 to load a *trusted* file that needs full pickle (any code)
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")  # what torch.save writes: a zip archive, or a bare pickle (before 1.6)


def pickle_allowed() -> bool:
    """Whether the user vouched for the files they load (``PROJECT_ALLOW_PICKLE=1``): full pickle, any code."""
    return os.environ.get(ALLOW_PICKLE_ENV, "") == "1"


def _check_is_torch_file(file: Path) -> None:
    if file.is_dir():
        if reason := incomplete(file):  # a layer's format (a folder of shards) that lacks what its save writes last
            raise UserError(reason)
        raise UserError(f"'{file}' is a folder, not a file; give a file inside it (e.g. {file}/checkpoints/last.ckpt)")
    if not file.is_file():
        raise UserError(f"file '{file}' does not exist; check the path (relative paths start at {Path.cwd()})")
    with open(file, "rb") as handle:
        head = handle.read(4)
    if not head.startswith(_TORCH_MAGIC):
        shown = head.decode("utf-8", "replace").strip() or repr(head)
        raise UserError(
            f"'{file}' is not a file written by torch.save (it starts with {shown!r}); give a checkpoint (.ckpt) "
            "or a state dict (.pt)"
        )


def check_integrity(file: Path) -> None:
    """Refuse a torch zip file damaged after it was written: torch never checks the CRC32s, and trains on garbage."""
    with open(file, "rb") as handle:
        if handle.read(4) != _TORCH_MAGIC[0]:
            return  # a legacy bare pickle carries no checksums
    try:
        with zipfile.ZipFile(file) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise UserError(f"'{file}' is truncated or corrupt and cannot be loaded ({first_line(error)})") from error
    if damaged is not None:
        raise UserError(
            f"'{file}' is damaged: its member {damaged!r} fails its CRC32 check (the bytes changed after the file "
            "was written); use an older checkpoint or retrain, and check the disk"
        )


def safe_load(path: str | os.PathLike[str]) -> Any:
    """``torch.load`` with ``weights_only=True`` of a file whose checksums hold; every failure a one-line UserError."""
    file = Path(path)
    try:
        file.resolve(strict=False)  # a symbolic link loop, before anything reads it
    except (RuntimeError, OSError) as error:  # RuntimeError up to Python 3.12, OSError (ELOOP) after
        raise UserError(
            f"'{file}' is a symbolic link that leads back to itself (a loop), so it names no file; point it at the "
            "checkpoint file, or give that file's own path"
        ) from error
    pending.wait_for(file)  # a checkpoint this process is still writing in the background: read it complete
    _check_is_torch_file(file)
    check_integrity(file)
    trusted = pickle_allowed()
    try:
        return torch.load(file, map_location="cpu", weights_only=not trusted)
    except pickle.UnpicklingError as error:
        if trusted:
            raise UserError(f"'{file}' cannot be unpickled even as a trusted file ({first_line(error)})") from error
        # torch names the first class or function the file would import and run: "GLOBAL faults.Extra".
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        what = f"a pickled {found.group(1)}" if found else "pickled objects beyond tensors and plain containers"
        raise UserError(
            f"'{file}' holds {what}, which only arbitrary code can load (unpickling can run any code), so "
            f"weights_only=True refuses it; if you trust the file, rerun with {ALLOW_PICKLE_ENV}=1"
        ) from error
    except Exception as error:  # torch raises RuntimeError, EOFError, BadZipFile, KeyError... for a damaged file
        raise UserError(f"'{file}' is truncated or corrupt and cannot be loaded ({first_line(error)})") from error


def refuse_untrusted_import(path: Any, where: str, trusted: Iterable[str], fix: str) -> None:
    """Refuse (UserError) an import path a file from outside names, unless its module is within ``trusted``.

    Importing runs code, so a received file never chooses what is imported, as it never chooses what is unpickled.
    ``where`` names the file's field for the message; ``fix`` says how the caller vouches (``""``: nothing can).
    """
    module = module_of(path) if isinstance(path, str) and ":" not in path else ""
    if not module or not within(module, trusted):
        raise UserError(
            f"{where} {path!r}, outside the modules it may import ({', '.join(trusted)}): importing a module runs its "
            f"code, so a received file never chooses one and nothing was imported; "
            + (f"if you trust the file and that module, {fix}" if fix else "fix the file")
        )


def load_lightning_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A Lightning checkpoint (a dict with ``state_dict``) loaded safely, or a one-line :class:`UserError`."""
    checkpoint = safe_load(path)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise UserError(
            f"'{path}' is not a Lightning checkpoint (no state_dict); give a .ckpt written by fit, or load plain "
            "weights with --model.init_args.weights"
        )
    return checkpoint


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint to start from: a Lightning checkpoint file, or a format's summary."""
    found = format_of(path)
    return found.summary(path) if found is not None else load_lightning_checkpoint(path)


def read_resumable(path: str | os.PathLike[str]) -> Any:
    """What the checkpoint at ``path`` holds, for choosing it (a format's summary; a file as it is)."""
    found = format_of(path)
    return found.summary(path) if found is not None else safe_load(path)


def read_weights(path: str | os.PathLike[str]) -> Any:
    """What a weights file holds; a format's checkpoint as one Lightning checkpoint of its weights."""
    found = format_of(path)
    return found.load(path, weights_only=True) if found is not None else safe_load(path)


def checkpoint_weights(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``state_dict`` of a Lightning checkpoint: a file, or a format's checkpoint merged here (weights only)."""
    found = format_of(path)
    checkpoint = found.load(path, weights_only=True) if found is not None else load_lightning_checkpoint(path)
    return checkpoint["state_dict"]
