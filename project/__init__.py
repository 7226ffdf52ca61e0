"""A PyTorch Lightning training template: the seed's DP and DDP recipes as one config choice."""

import os
import sys

__version__ = "0.1.0"


class _ElsewhereSkipped:
    """An editable install's finder that no longer answers for this package (it maps it to another checkout)."""

    def __init__(self, finder: object) -> None:
        self.finder = finder

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        """The wrapped finder's answer, except for this package and its modules: those are this checkout's."""
        if fullname == __name__ or fullname.startswith(f"{__name__}."):
            return None
        return self.finder.find_spec(fullname, path, target)  # type: ignore[attr-defined]


def _this_checkout_only() -> None:
    """Import ``project.*`` from this folder only, never from the checkout the shared environment installed.

    ``pip install -e .``'s finder maps ``project`` to the installed checkout: a module missing from a copy run with
    the same .venv would silently come from there. When it maps to another folder, it stops answering for
    ``project.*`` (a missing module is missing, as in a fresh install) and keeps answering for anything else.
    """
    here = os.path.realpath(os.path.dirname(__file__))
    for index, finder in enumerate(sys.meta_path):
        mapping = getattr(sys.modules.get(getattr(finder, "__module__", "")), "MAPPING", None)  # setuptools'
        installed = mapping.get(__name__) if isinstance(mapping, dict) else None
        if isinstance(installed, str) and os.path.realpath(installed) != here:
            sys.meta_path[index] = _ElsewhereSkipped(finder)


_this_checkout_only()
