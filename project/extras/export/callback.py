"""The export of the bare network at the end of ``fit``: ``<run>/export/model.pt`` and ``model.json``.

The core's :class:`~project.callbacks.unwrap.UnwrapEvalCallback` says whether and what to export (``export``,
``export_best``, ``net_attribute``); this layer's ``callbacks`` hook adds :class:`ExportCallback` to every ``fit``,
which reads those settings at ``setup`` and fills the core callback's ``exporter``. Rank 0 alone exports the
plain network of the best checkpoint (or of the final weights when there is none). Whether that export can be
rebuilt is checked at ``setup``, before training.

A network that no class path rebuilds (built in the LightningModule's ``__init__``, e.g. ``nn.Sequential``)
is exported as its state dict, with one warning line, or by a layer's export of it besides its state dict
(:mod:`project.extras.export.network_exports`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn

from project.callbacks.best_checkpoint import best_checkpoint_path
from project.callbacks.unwrap import UnwrapEvalCallback
from project.checkpoints.loading import checkpoint_weights
from project.errors import UserError
from project.export import match_state_dict
from project.extras.export.network_exports import (
    NO_CLASS_PATH,
    STATE_DICT_FORMAT,
    NetworkExport,
    network_exports,
    weights_only,
)
from project.extras.export.weights import (
    EXPORT_WEIGHTS,
    check_rebuildable,
    class_path,
    export_network,
    export_state_dict,
    network_spec,
)
from project.parallel.ddp import unwrap
from project.parallel.strategies import row_of
from project.runs import run_directory


def find_network(module: nn.Module, attribute: str | None) -> tuple[str, nn.Module]:
    """The network a LightningModule trains: ``attribute``, else ``net``, else its one child with parameters.

    Raises:
        UserError: the attribute does not hold a module, or the choice is not clear.
    """
    children = dict(module.named_children())
    if attribute is not None:
        net = getattr(module, attribute, None)
        if isinstance(net, nn.Module):
            return attribute, net
        raise UserError(
            f"UnwrapEvalCallback(net_attribute={attribute!r}): {type(module).__name__} has no network at "
            f".{attribute} (its modules: {', '.join(children) or 'none'}); set net_attribute to one of them"
        )
    if isinstance(children.get("net"), nn.Module):
        return "net", children["net"]
    with_parameters = [name for name, child in children.items() if any(True for _ in child.parameters())]
    if len(with_parameters) == 1:
        return with_parameters[0], children[with_parameters[0]]
    raise UserError(
        f"UnwrapEvalCallback cannot tell which of {type(module).__name__}'s modules is the network to export "
        f"({', '.join(with_parameters) or 'none has parameters'}); set its net_attribute"
    )


def _configured(pl_module: L.LightningModule, attribute: str) -> Mapping[str, Any] | None:
    """How the config built the network: the module's hyperparameter of that name, under LightningCLI."""
    value = pl_module.hparams.get(attribute)
    return value if isinstance(value, Mapping) and "class_path" in value else None


def export_callbacks(state: Any, row: Any, config: Any) -> list[L.Callback]:
    """The layer's ``callbacks`` hook: every command that trains gets the export (inert without UnwrapEvalCallback)."""
    return [ExportCallback()] if row.trains else []


class ExportCallback(L.Callback):
    """Export the bare network at fit end as the config's :class:`UnwrapEvalCallback` asks (``export: true``)."""

    def __init__(self) -> None:
        self.asked: UnwrapEvalCallback | None = None
        self._spec: dict[str, Any] | None = None
        self._other: NetworkExport | None = None  # a layer's export of a network that no class path rebuilds

    @property
    def export(self) -> bool:
        """Whether the config's UnwrapEvalCallback asks for an export."""
        return self.asked is not None and self.asked.export

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Before training: find the network and check that its export can be rebuilt.

        A network that neither its own ``init_args`` nor the config rebuild is exported otherwise (its weights only,
        or by a layer's export).
        """
        if stage != "fit" or self._spec is not None:
            return
        asked = [callback for callback in trainer.callbacks if isinstance(callback, UnwrapEvalCallback)]
        self.asked = asked[0] if asked else None
        if not self.export:
            return
        self.asked.exporter = self
        if is_overridden("configure_model", pl_module):  # its layers exist from configure_model on: on_fit_start
            return
        self._find_spec(pl_module)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A module that builds its network in ``configure_model``: find it now that Lightning has called it."""
        if self.export and self._spec is None:
            self._find_spec(pl_module)

    def _find_spec(self, pl_module: L.LightningModule) -> None:
        attribute, net = find_network(unwrap(pl_module), self.asked.net_attribute)
        self.asked.net_attribute = attribute
        try:
            spec = network_spec(net, _configured(pl_module, attribute))
        except UserError:
            network = class_path(unwrap(net))
            self._other = next(iter(network_exports()), None)
            self._spec = (
                {"format": self._other.format, "network": network}
                if self._other is not None
                else weights_only(network, NO_CLASS_PATH)
            )
            return
        check_rebuildable(spec, net)
        self._spec = spec

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rank 0 lets a layer's export watch the unsharded network's next forward call (the first in training)."""
        if self._other is not None and trainer.is_global_zero and not row_of(trainer.strategy).shards_parameters:
            _, net = find_network(unwrap(pl_module), self.asked.net_attribute)
            self._other.record(unwrap(net))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rank 0 exports the plain network; the others wait for nothing (no collective here).

        The one exception: a sharded network without a best checkpoint is gathered from its shards on every
        rank (a collective) and written by rank 0.
        """
        if not self.export or self._spec is None:
            return
        if self._other is not None:
            self._other.stop()  # never called in training: nothing to record after it
        log_dir = run_directory(trainer)
        name, net = find_network(unwrap(pl_module), self.asked.net_attribute)
        best = self._best_path(trainer)
        row = row_of(trainer.strategy)
        sharded, gathered = row.shards_parameters, None
        if best is None and sharded and not trainer.fast_dev_run:  # a collective: every rank
            gathered = _whole_network_state(trainer, name) if row.stages else _gather_full_state(net)
        if not trainer.is_global_zero or log_dir is None or trainer.fast_dev_run:
            return
        folder = Path(log_dir) / "export"
        state = None
        if best is not None:
            # Read from the file (or the sharded folder), so the in-memory model (what `test` after fit sees)
            # is untouched.
            state = match_state_dict(checkpoint_weights(best), net)
        elif gathered is not None:
            state = gathered
        spec = self._spec
        if self._other is not None:
            spec = self._other.write(unwrap(net), self._spec, state, folder, sharded)
        elif spec.get("format") == STATE_DICT_FORMAT:
            sys.stderr.write(
                f"warning: {spec['network']}: {spec['reason']}; export/ holds its state dict {EXPORT_WEIGHTS} only "
                "(build the network in your code and load it with project.export.load_weights)\n"
            )
            sys.stderr.flush()
        if state is not None:
            self.asked.export_dir = export_state_dict(state, folder, spec)
        else:
            self.asked.export_dir = export_network(net, folder, spec)

    def _best_path(self, trainer: L.Trainer) -> str | None:
        return best_checkpoint_path(trainer) if self.asked.export_best else None  # the checkpoint test after fit takes


def _whole_network_state(trainer: L.Trainer, name: str) -> dict[str, Any]:
    """The network's part of the whole model a strategy of stages gathers itself (call on every rank)."""
    prefix = f"{name}."
    whole = trainer.strategy.lightning_module_state_dict()
    return {key[len(prefix) :]: value for key, value in whole.items() if key.startswith(prefix)}


def _gather_full_state(net: nn.Module) -> dict[str, Any]:
    """The full state dict of a sharded network, gathered from every rank's shards (call on every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
