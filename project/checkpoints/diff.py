"""The one comparison of two state dicts: which keys are missing, which are unexpected, which shapes differ."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateDictDiff:
    """How a state dict (``given``) differs from the one a module expects (``own``)."""

    missing: list[str]
    unexpected: list[str]
    #: (key, given shape, own shape)
    wrong_shape: list[tuple[str, tuple[int, ...], tuple[int, ...]]]

    def __bool__(self) -> bool:
        """True when the two differ at all."""
        return bool(self.missing or self.unexpected or self.wrong_shape)

    def describe(self, limit: int = 8) -> str:
        """One line: ``missing keys [...]; unexpected keys [...]; shape mismatch [key (given) vs (own)]``."""
        shapes = [f"{key} {given} vs {own}" for key, given, own in self.wrong_shape[: max(1, limit // 2)]]
        parts = [("missing keys", self.missing[:limit]), ("unexpected keys", self.unexpected[:limit])]
        return "; ".join(f"{what} {listed}" for what, listed in [*parts, ("shape mismatch", shapes)] if listed)


def diff_state_dicts(given: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> StateDictDiff:
    """Compare ``given`` (from a file) with ``own`` (what the module holds), keys sorted."""
    common = sorted(set(own) & set(given))
    return StateDictDiff(
        missing=sorted(set(own) - set(given)),
        unexpected=sorted(set(given) - set(own)),
        wrong_shape=[(k, tuple(given[k].shape), tuple(own[k].shape)) for k in common if given[k].shape != own[k].shape],
    )
