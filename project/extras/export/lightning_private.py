"""The export layer's private torch name: a module compiled in place keeps its call in ``_compiled_call_impl``."""

from __future__ import annotations

from typing import Any


def drop_compiled_call(module: Any) -> None:
    """Make a module compiled in place (a copy of one) run its eager forward again."""
    module._compiled_call_impl = None
