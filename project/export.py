"""Plain weights in: raw DP/DDP, compiled and Lightning state dicts loaded into a bare network (no Lightning import)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.checkpoints.diff import diff_state_dicts
from project.checkpoints.loading import read_weights
from project.errors import UserError
from project.parallel.ddp import WRAPPER_ATTRS

_WRAPPER_PREFIXES = tuple(f"{attr}." for attr in WRAPPER_ATTRS)


def _state_dict_of(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]  # a Lightning checkpoint
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UserError(f"'{path}' holds no state dict (found {type(obj).__name__}); save model.state_dict()")
    return obj


def _strip_wrappers(key: str) -> str:
    while prefix := next((p for p in _WRAPPER_PREFIXES if key.startswith(p)), None):
        key = key[len(prefix) :]
    return key


def match_state_dict(state: dict[str, torch.Tensor], net: nn.Module) -> dict[str, torch.Tensor]:
    """Map a raw DP/DDP, compiled or Lightning state dict's keys onto ``net``'s: wrapper, then module prefixes go."""
    stripped = {_strip_wrappers(k): v for k, v in state.items()}
    wanted = set(net.state_dict())
    if wanted <= set(stripped):
        return stripped  # extra keys stay, so that load_weights reports them as unexpected
    prefixes: Counter[str] = Counter()
    for key in stripped:
        for name in wanted:
            if key.endswith(name) and key[: len(key) - len(name)].endswith("."):
                prefixes[key[: len(key) - len(name)]] += 1
    if prefixes:
        prefix, _ = prefixes.most_common(1)[0]
        inner = {k[len(prefix) :]: v for k, v in stripped.items() if k.startswith(prefix)}
        if set(inner) == wanted:
            return inner
    return stripped


def load_weights(net: nn.Module, path: str | os.PathLike[str]) -> None:
    """Load a plain, DataParallel/DDP (``module.``), Lightning ``.ckpt`` or sharded (merged) state dict into ``net``.

    Loaded before any sharding (DP/DDP weights start an FSDP run too); a ``UserError`` if unreadable or unfitting.
    """
    file = Path(path)
    state = match_state_dict(_state_dict_of(read_weights(file), file), net)
    diff = diff_state_dicts(state, net.state_dict())
    if diff:
        raise UserError(
            f"weights '{file}' do not fit {type(net).__name__}: {diff.describe(limit=64)} (file vs network); "
            "point --model.init_args.weights at weights of the same network, or change the network's init_args"
        )
    net.load_state_dict(state)
