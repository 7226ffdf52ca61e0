"""The export of a network that no class path rebuilds (built in a LightningModule's ``__init__``).

A class path and its ``init_args`` rebuild most networks (:mod:`.weights`). For the others a layer may add an
export of its own (``Layer.network_exports``, a :class:`NetworkExport`), written beside the state dict by
:class:`.callback.ExportCallback` and read back by :func:`.weights.rebuild`. Without one, the export holds the state
dict only, and ``model.json`` says so (:func:`weights_only`). Nothing here imports Lightning.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from torch import nn

import project.commands  # noqa: F401  (a layer.py imports the command table, which lists the layers: it goes first)
from project.layers import hooks

#: ``model.json``'s ``format`` for a network exported as its state dict only.
STATE_DICT_FORMAT = "state_dict"
#: Why an export holds the state dict only, when no layer exports the network otherwise.
NO_CLASS_PATH = "no class path rebuilds it: it has no init_args dict and the config does not build it by class_path"


class NetworkExport(Protocol):
    """A layer's export of a network that no class path rebuilds, beside its state dict."""

    #: ``model.json``'s ``format`` for it (``{"format": ..., "network": class path of the network}``).
    format: str

    def record(self, net: nn.Module) -> None:
        """Rank 0, as training starts, on an unsharded network: watch what it needs (its next forward call)."""

    def stop(self) -> None:
        """Training is over: watch no more (every rank)."""

    def write(
        self, net: nn.Module, spec: dict[str, Any], state: Mapping[str, Any] | None, folder: Path, sharded: bool
    ) -> dict[str, Any]:
        """Rank 0: write the export of ``net`` (``state``'s weights if given) into ``folder``; ``model.json``'s spec.

        Where it cannot, it says why in one warning line and returns :func:`weights_only`: the run is not failed.
        """

    def load(self, folder: Path, spec: Mapping[str, Any]) -> nn.Module:
        """The network rebuilt from ``folder``, whose ``model.json`` is ``spec``."""


def network_exports() -> list[NetworkExport]:
    """The installed layers' exports, the first one preferred; none: the state dict only."""
    return [make() for make in hooks("network_exports")]


def weights_only(network: str, reason: str) -> dict[str, Any]:
    """``model.json`` of an export that holds the state dict of ``network`` only, and why."""
    return {"format": STATE_DICT_FORMAT, "network": network, "reason": reason}
