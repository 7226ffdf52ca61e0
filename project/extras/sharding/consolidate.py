"""``python -m project consolidate CKPT_DIR [--out FILE] [--weights_only]``: a sharded checkpoint as one plain file.

``CKPT_DIR`` may be the URL of a checkpoint a run committed to object storage (``s3://.../checkpoints/last.ckpt``):
its committed copy is pulled into this machine's scratch cache first (endpoint and credentials from the
environment, as a run's).

A sharded (``scenario: fsdp``) checkpoint is a folder of per-rank shards. This merges it in one process, without
a process group or a GPU, into an ordinary Lightning ``.ckpt`` (weights, optimizer state, loops, callbacks): what
``--ckpt_path`` of any scenario, ``--model.init_args.weights`` and plain ``torch.load`` take. ``--weights_only``
writes the LightningModule's state dict alone. The file is written atomically; an existing one is never replaced.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from project.checkpoints.atomic import atomic_torch_save
from project.errors import UserError
from project.extras.sharding.checkpoints import is_sharded_checkpoint
from project.extras.sharding.checkpoints.merge import load_full_checkpoint
from project.run_store import is_url, local_copy

USAGE = "python -m project consolidate CKPT_DIR [--out FILE] [--weights_only]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"consolidate: {message}; usage: {USAGE}")


def default_output(folder: Path) -> Path:
    """``last.ckpt/`` -> ``last.consolidated.ckpt`` beside it."""
    return folder.with_name(f"{folder.name.removesuffix('.ckpt')}.consolidated.ckpt")


def _check_output(out: Path) -> None:
    """Refuse an output that exists (never replaced) or whose folder does not."""
    if out.exists():
        raise UserError(f"consolidate: '{out}' exists and is not replaced; remove it or give another --out")
    if not out.parent.is_dir():
        raise UserError(f"consolidate: the folder of --out '{out}' does not exist; create it or give another --out")


def consolidate(args: list[str]) -> Path:
    """Merge the sharded checkpoint named in ``args`` into one file; returns the file.

    Raises:
        UserError: not a sharded checkpoint folder, an output that exists, or a checkpoint that does not load.
    """
    parser = _Parser(prog="python -m project consolidate", description=__doc__)
    parser.add_argument(
        "checkpoint", help="a sharded checkpoint folder (e.g. checkpoints/last.ckpt), or its URL in object storage"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="the file to write (default: <name>.consolidated.ckpt beside it; for a URL, in this folder)",
    )
    parser.add_argument("--weights_only", action="store_true", help="write the module's state dict only")
    options = parser.parse_args(args)
    # A URL's default output is in this folder: its cached copy is not a place anyone looks for results.
    named = Path(options.checkpoint.rstrip("/").rsplit("/", 1)[-1]) if is_url(options.checkpoint) else None
    out = Path(options.out) if options.out else default_output(named or Path(options.checkpoint))
    _check_output(out)
    folder = Path(
        local_copy(options.checkpoint, "consolidate")
    )  # a URL: its committed copy, pulled into the scratch cache
    if not is_sharded_checkpoint(folder):
        what = "a file" if folder.is_file() else "not a sharded checkpoint folder" if folder.exists() else "missing"
        raise UserError(
            f"consolidate: '{folder}' is {what}; give a sharded checkpoint folder written by scenario fsdp "
            "(one with .metadata and meta.pt, e.g. logs/<name>/version_<n>/checkpoints/last.ckpt)"
        )
    checkpoint = load_full_checkpoint(folder, weights_only=options.weights_only)
    atomic_torch_save(checkpoint["state_dict"] if options.weights_only else checkpoint, out)
    what = "state dict" if options.weights_only else "Lightning checkpoint"
    sys.stdout.write(
        f"Consolidated {folder} (epoch {checkpoint.get('epoch')}, step {checkpoint.get('global_step')}) into {out}: "
        f"a plain {what}\n"
    )
    return out
