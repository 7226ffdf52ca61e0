"""Objects named by import path: ``package.module.Name`` (as configs write class paths) or ``package.module:name``."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from collections.abc import Iterable
from typing import Any


def import_object(path: str) -> Any:
    """The object ``path`` names (ImportError, AttributeError; ValueError when ``path`` names no module)."""
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


def import_failure(path: str) -> str | None:
    """Why the class path ``path`` does not import, in one line (None if it does): jsonargparse keeps no traceback."""
    module_name, _, name = path.rpartition(".")
    if not module_name:
        return None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if not error.name or not within(module_name, [error.name]):  # a dependency of the user's module
            return f"module {module_name} failed to import: {_exception(error)}; install it or fix the import"
        top = module_name.partition(".")[0]
        fix = (
            f"run python -m project from the folder that holds {top}/, put that folder on PYTHONPATH, "
            "or pip install -e your package"
            if error.name == top
            else f"check the module's name ({error.name.rpartition('.')[0]} has no module {error.name})"
        )
        return f"cannot import module {module_name} ({error}); {fix}"
    except SyntaxError as error:
        where = f" ({_shown(error.filename or '?')}:{error.lineno})"
        return f"module {module_name} has a syntax error: {error.msg}{where}; fix the file"
    except Exception as error:  # whatever the user's module raised while it was imported
        return f"module {module_name} failed to import: {_exception(error)}; fix the module"
    try:
        getattr(module, name)
    except AttributeError:
        where = f" ({_shown(module.__file__)})" if getattr(module, "__file__", None) else ""
        close = difflib.get_close_matches(name, [n for n in dir(module) if not n.startswith("_")], n=1)
        return f"module {module_name}{where} has no class {name}" + (f"; did you mean {close[0]}?" if close else "")
    return None


def _exception(error: BaseException) -> str:
    """``Type: message (file:line)``, the line being the innermost one of the user's code (not a library's)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)[1:] if not f.filename.startswith("<")]
    libraries = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    own = [f for f in frames if not any(os.path.realpath(f.filename).startswith(lib + os.sep) for lib in libraries)]
    frame = (own or frames or [None])[-1]
    where = f" ({_shown(frame.filename)}:{frame.lineno})" if frame is not None else ""
    return f"{type(error).__name__}: {error}{where}"


def _shown(filename: str) -> str:
    """A file as the user knows it: relative to the working folder when it lies under it."""
    relative = os.path.relpath(filename)
    return filename if relative.startswith("..") else relative
