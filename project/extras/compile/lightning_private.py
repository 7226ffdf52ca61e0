"""The compile layer's private torch name: a module compiled in place keeps its call in ``_compiled_call_impl``."""

from __future__ import annotations

from typing import Any


def compiled_call(module: Any) -> Any:
    """The compiled forward of a module compiled in place (``nn.Module.compile``); ``None`` when it is not."""
    return getattr(module, "_compiled_call_impl", None)
