"""Plain weights in and out: unwrap, import raw DP/DDP/Lightning files, export and rebuild.

Nothing here imports Lightning, so :func:`rebuild` works in a plain Python process.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import re
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.atomic import atomic_torch_save, atomic_write_text
from project.errors import UserError

#: Set to 1 to load a *trusted* file that needs arbitrary code (full pickle) to load.
ALLOW_PICKLE_ENV = "PROJECT_ALLOW_PICKLE"
EXPORT_WEIGHTS = "model.pt"
EXPORT_SPEC = "model.json"
# Attributes through which wrappers hold the module they wrap: DataParallel/DDP (`module`),
# torch.compile (`_orig_mod`), Lightning's and Fabric's wrappers (`_forward_module`).
_WRAPPER_ATTRS = ("module", "_orig_mod", "_forward_module")
_WRAPPER_PREFIXES = tuple(f"{attr}." for attr in _WRAPPER_ATTRS)


def _is_wrapper(model: nn.Module) -> bool:
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return True
    # Matched by name so that this module never imports Lightning or torch._dynamo.
    return type(model).__name__ in {
        "OptimizedModule",
        "_LightningModuleWrapperBase",
        "_FabricModule",
        "_LightningPrecisionModuleWrapperBase",
    }


def unwrap(model: nn.Module) -> nn.Module:
    """Return the bare module under DataParallel, DDP, torch.compile and Lightning/Fabric wrappers.

    This is the seed's ``model = model.module``, for any depth of nesting.
    """
    seen = 0
    while _is_wrapper(model):
        inner = next((getattr(model, attr) for attr in _WRAPPER_ATTRS if hasattr(model, attr)), None)
        if not isinstance(inner, nn.Module) or seen > 32:
            break
        model, seen = inner, seen + 1
    return model


def pickle_allowed() -> bool:
    """Whether the user vouched for the files they load (``PROJECT_ALLOW_PICKLE=1``): full pickle, any code."""
    return os.environ.get(ALLOW_PICKLE_ENV, "") == "1"


def safe_load(path: str | os.PathLike[str]) -> Any:
    """``torch.load`` with ``weights_only=True``, turning every failure into a one-line :class:`UserError`."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"file '{file}' does not exist; check the path (relative paths start at {Path.cwd()})")
    try:
        return torch.load(file, map_location="cpu", weights_only=not pickle_allowed())
    except pickle.UnpicklingError as error:
        # torch names the first class or function the file would import and run: "GLOBAL faults.Extra".
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        what = f"a pickled {found.group(1)}" if found else "pickled objects beyond tensors and plain containers"
        raise UserError(
            f"'{file}' holds {what}, which only arbitrary code can load (unpickling can run any code), so "
            f"weights_only=True refuses it; if you trust the file, rerun with {ALLOW_PICKLE_ENV}=1"
        ) from error
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"'{file}' is truncated or corrupt and cannot be loaded ({reason})") from error


def _state_dict_of(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]  # a Lightning checkpoint
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UserError(f"'{path}' holds no state dict (found {type(obj).__name__}); save model.state_dict()")
    return obj


def _strip_wrappers(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def match_state_dict(state: dict[str, torch.Tensor], net: nn.Module) -> dict[str, torch.Tensor]:
    """Map keys of a raw DP/DDP, compiled or Lightning state dict onto ``net``'s own keys.

    Wrapper prefixes (``module.``, ``_orig_mod.``) are dropped, then the prefix under which a
    LightningModule held the network (e.g. ``net.``) is found from the keys themselves.
    """
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
    """Load a plain, DataParallel/DDP (``module.``) or Lightning ``.ckpt`` state dict into ``net``.

    Raises:
        UserError: the file is missing, unsafe, corrupt, or its keys/shapes do not fit ``net``
            (the message lists missing and unexpected keys).
    """
    file = Path(path)
    state = match_state_dict(_state_dict_of(safe_load(file), file), net)
    own = net.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong_shape = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong_shape:
        parts = [
            f"missing keys {missing}" if missing else "",
            f"unexpected keys {unexpected}" if unexpected else "",
        ]
        parts += [f"shape mismatch {[(k, tuple(state[k].shape), tuple(own[k].shape)) for k in wrong_shape]}"]
        detail = "; ".join(p for p in parts if p and not p.endswith("[]"))
        raise UserError(
            f"weights '{file}' do not fit {type(net).__name__}: {detail}; "
            "point --model.init_args.weights at weights of the same network, or change the network's init_args"
        )
    net.load_state_dict(state)


def network_spec(net: nn.Module) -> dict[str, Any]:
    """``{"class_path", "init_args"}`` of a plain network that records its ``init_args``."""
    init_args = getattr(net, "init_args", None)
    if not isinstance(init_args, dict):
        raise UserError(
            f"{type(net).__name__} has no `init_args` dict, so it cannot be rebuilt from export/; "
            "store the constructor arguments in self.init_args (see project/models/digits_net.py)"
        )
    cls = type(net)
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": dict(init_args)}


def export_network(net: nn.Module, folder: str | os.PathLike[str]) -> Path:
    """Write ``model.pt`` (bare state dict) and ``model.json`` (class path + init args) into ``folder``."""
    out = Path(folder)
    bare = unwrap(net)
    spec = network_spec(bare)
    state = {k: v.detach().cpu().clone() for k, v in bare.state_dict().items()}
    atomic_torch_save(state, out / EXPORT_WEIGHTS)
    atomic_write_text(out / EXPORT_SPEC, json.dumps(spec, indent=2) + "\n")
    return out


def rebuild(folder: str | os.PathLike[str]) -> nn.Module:
    """Rebuild the exported network from ``folder`` (``model.json`` + ``model.pt``), in eval mode.

    Needs only torch and the network's own module; Lightning is never imported.
    """
    spec_file = Path(folder) / EXPORT_SPEC
    if not spec_file.is_file():
        raise UserError(f"'{spec_file}' does not exist; export/ is written at the end of `fit`")
    spec = json.loads(spec_file.read_text())
    module_name, _, class_name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    net = cls(**spec["init_args"])
    load_weights(net, Path(folder) / EXPORT_WEIGHTS)
    return net.eval()
