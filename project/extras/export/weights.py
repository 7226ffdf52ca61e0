"""The export of a plain network: ``export/model.pt`` and ``model.json`` written, and :func:`rebuild` from them.

Nothing here imports Lightning, so :func:`rebuild` works in a plain Python process. Loading weights into a network
(raw DP/DDP files too) is the core's :func:`project.export.load_weights`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.checkpoints.atomic import atomic_torch_save, atomic_write_text
from project.checkpoints.diff import diff_state_dicts
from project.checkpoints.loading import refuse_untrusted_import
from project.dotted import import_object, module_of, names_object
from project.errors import UserError
from project.export import load_weights
from project.extras.export.network_exports import STATE_DICT_FORMAT, network_exports
from project.layers import installed
from project.parallel.ddp import unwrap

EXPORT_WEIGHTS = "model.pt"
EXPORT_SPEC = "model.json"
#: The modules whose networks :func:`rebuild` imports unasked (the template's, torch's, and the layers' own
#: ``trusted_modules``); others the caller names: an export is a file people send each other, so its ``model.json``
#: never chooses what is imported.
TRUSTED_MODULES = ("project.models", "torch.nn")


def class_path(obj: object) -> str:
    """``module.QualName`` of ``obj``'s class, as a config's ``class_path`` names it."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def network_spec(net: nn.Module, configured: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"class_path", "init_args"}`` that rebuild ``net``: its own ``init_args``, else the config's.

    Args:
        net: The plain network.
        configured: How the config built it (``{"class_path", "init_args"}``), if it did; used when
            ``net`` does not record its constructor arguments (e.g. ``torch.nn.Linear``).

    Raises:
        UserError: neither says how to build ``net`` again.
    """
    init_args = getattr(net, "init_args", None)
    if isinstance(init_args, dict):
        return {"class_path": class_path(net), "init_args": dict(init_args)}
    if configured is not None and names_object(configured.get("class_path"), type(net)):
        return {"class_path": configured["class_path"], "init_args": dict(configured.get("init_args") or {})}
    raise UserError(
        f"{class_path(net)} cannot be rebuilt from export/: it has no `init_args` dict and the config does not "
        "build it by class_path; give the network in the config as class_path/init_args, store its constructor "
        "arguments in self.init_args, or set export: false on UnwrapEvalCallback"
    )


def check_rebuildable(spec: Mapping[str, Any], net: nn.Module) -> None:
    """Build ``spec`` on the meta device (no memory) and compare it with ``net``; a one-line error if it differs.

    Raises:
        UserError: the class does not import, does not take its init_args, or builds another network.
    """
    where = f"export of {spec['class_path']}"
    try:
        cls = import_object(spec["class_path"])
        with torch.device("meta"):
            built = cls(**spec["init_args"])
    except Exception as error:  # any failure of the user's constructor means: cannot be rebuilt
        raise UserError(f"{where} could not be rebuilt from {dict(spec['init_args'])}: {error}") from error
    diff = diff_state_dicts(built.state_dict(), net.state_dict())
    if diff:
        raise UserError(
            f"{where} would rebuild another network than the one trained ({diff.describe()}; rebuilt vs trained); "
            "make its init_args describe the trained network"
        )


def _layers_trusted() -> list[str]:
    """The installed layers' ``trusted_modules``."""
    # A layer.py imports the command table, which lists the layers as it is imported: importing it first keeps
    # the listing from starting inside itself in a plain process (rebuild without the CLI).
    import project.commands  # noqa: F401

    return [module for layer in installed() for module in layer.trusted_modules]


def _module_class(path: Any, spec_file: Path, trusted: Iterable[str]) -> type[nn.Module]:
    """The ``nn.Module`` subclass an export's ``model.json`` names, in a trusted module: else refused, nothing run.

    An export is what people share: ``model.pt`` loads weights-only, and ``model.json`` must not run code either.
    """
    plain = isinstance(path, str) and ":" not in path
    fix = f"call rebuild({str(spec_file.parent)!r}, trusted=[{module_of(path)!r}])" if plain else ""
    asked = (trusted,) if isinstance(trusted, str) else tuple(trusted)  # a str is one module
    roots = (*TRUSTED_MODULES, *_layers_trusted(), *asked)
    refuse_untrusted_import(path, f"'{spec_file}' names class_path", roots, fix)
    try:
        found = import_object(path)
    except (ImportError, AttributeError, ValueError) as error:
        raise UserError(f"'{spec_file}' names class_path {path!r}, which cannot be imported ({error})") from error
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        raise UserError(
            f"'{spec_file}' names class_path {path!r}, which is not an nn.Module subclass; an export rebuilds only "
            "a network (nothing was called): fix model.json or re-export the run"
        )
    return found


def export_network(net: nn.Module, folder: str | os.PathLike[str], spec: Mapping[str, Any] | None = None) -> Path:
    """Write ``model.pt`` (bare state dict) and ``model.json`` (class path + init args) into ``folder``.

    ``spec`` defaults to :func:`network_spec` of the bare network.
    """
    bare = unwrap(net)
    spec = dict(spec) if spec is not None else network_spec(bare)
    return export_state_dict(bare.state_dict(), folder, spec)


def export_state_dict(
    state: Mapping[str, torch.Tensor], folder: str | os.PathLike[str], spec: Mapping[str, Any]
) -> Path:
    """Write the network's plain state dict (``model.pt``) and ``spec`` (``model.json``) into ``folder``.

    For a network whose weights are not in one module (a sharded network's, gathered from its shards).
    """
    out = Path(folder)
    atomic_torch_save({k: v.detach().cpu().clone() for k, v in state.items()}, out / EXPORT_WEIGHTS)
    atomic_write_text(out / EXPORT_SPEC, json.dumps(dict(spec), indent=2) + "\n")
    return out


def rebuild(folder: str | os.PathLike[str], trusted: Iterable[str] = ()) -> nn.Module:
    """Rebuild the exported network from ``folder``, in eval mode; Lightning is never imported.

    ``model.json`` says how. ``{"class_path", "init_args"}``: the class is built (an ``nn.Module`` subclass only)
    and ``model.pt`` loaded into it; needs torch and the network's module, within :data:`TRUSTED_MODULES` or
    ``trusted`` (``trusted=["mypkg.nets"]``): the file never chooses what is imported. Another ``format``: the
    layer's :class:`NetworkExport` of that format loads it (a network built in a LightningModule's ``__init__``).

    Raises:
        UserError: no export there, a refused ``model.json`` (untrusted, no network) or file, a state dict only.
    """
    spec_file = Path(folder) / EXPORT_SPEC
    if not spec_file.is_file():
        raise UserError(f"'{spec_file}' does not exist; export/ is written at the end of `fit`")
    spec = json.loads(spec_file.read_text())
    kind = spec.get("format")
    if kind == STATE_DICT_FORMAT:
        raise UserError(
            f"'{spec_file}': this export holds the state dict {EXPORT_WEIGHTS} of {spec.get('network')} only "
            f"({spec.get('reason')}); build the network in your code and load_weights(net, '{EXPORT_WEIGHTS}')"
        )
    if kind is not None:
        exports = network_exports()
        for export in exports:
            if export.format == kind:
                return export.load(Path(folder), spec)
        known = " and ".join(["class paths", *(export.format for export in exports)])
        raise UserError(f"'{spec_file}' has format {kind!r}; this version rebuilds {known}")
    net = _module_class(spec.get("class_path"), spec_file, trusted)(**spec.get("init_args", {}))
    load_weights(net, Path(folder) / EXPORT_WEIGHTS)
    return net.eval()
