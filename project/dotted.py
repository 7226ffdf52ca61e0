"""Objects named by import path: ``package.module.Name`` (as configs write class paths) or ``package.module:name``."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any


def import_object(path: str) -> Any:
    """The object ``path`` names.

    Raises:
        ImportError, AttributeError, ValueError: the module or the name does not exist, or ``path`` has no module.
    """
    module, sep, name = path.rpartition(":") if ":" in path else path.rpartition(".")
    if not sep or not module:
        raise ValueError(f"{path!r} is not an import path (package.module.Name)")
    return getattr(importlib.import_module(module), name)


def module_of(path: str) -> str:
    """The module part of an import path (``a.b.Name`` -> ``a.b``; ``a.b:name`` -> ``a.b``); ``""`` if it has none."""
    return path.rpartition(":")[0] if ":" in path else path.rpartition(".")[0]


def within(module: str, roots: Iterable[str]) -> bool:
    """Whether ``module`` is one of ``roots`` or inside one (``torch.nn.modules`` is within ``torch.nn``)."""
    return any(module == root or module.startswith(f"{root}.") for root in roots)


def names_object(path: Any, obj: Any) -> bool:
    """Whether ``path`` is an import path of ``obj`` (``torch.nn.Linear`` names ``torch.nn.modules.linear.Linear``)."""
    try:
        return isinstance(path, str) and import_object(path) is obj
    except (ImportError, AttributeError, ValueError):
        return False
