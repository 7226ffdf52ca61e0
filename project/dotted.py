"""Objects named by import path: ``package.module.Name`` (as configs write class paths) or ``package.module:name``."""

from __future__ import annotations

import importlib
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


def names_object(path: Any, obj: Any) -> bool:
    """Whether ``path`` is an import path of ``obj`` (``torch.nn.Linear`` names ``torch.nn.modules.linear.Linear``)."""
    try:
        return isinstance(path, str) and import_object(path) is obj
    except (ImportError, AttributeError, ValueError):
        return False
