"""jsonargparse's stub resolver, told this interpreter's ``sys.path`` instead of asking a new one.

typeshed_client's default search context starts ``python -c 'print(sys.path)'``: a second interpreter start in
every process, and a rank stopped while it waits leaves an orphan printing a ``BrokenPipeError`` into stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path


def resolve_stubs_in_process() -> None:
    """Install jsonargparse's stub resolver with this process's ``sys.path``; no-op without typeshed_client."""
    try:
        from jsonargparse import _stubs_resolver as stubs
    except ImportError:  # another jsonargparse layout: it keeps its own default
        return
    if not getattr(stubs, "typeshed_client_support", False) or stubs.stubs_resolver is not None:
        return
    import typeshed_client

    allow_py_files = stubs.get_parsing_setting("stubs_resolver_allow_py_files")
    # The child's path minus its '' entry, as typeshed_client filters it; here '' is the working directory.
    search_path = [Path(entry) for entry in sys.path if entry]
    context = typeshed_client.get_search_context(search_path=search_path, allow_py_files=allow_py_files)
    stubs.stubs_resolver = stubs.StubsResolver(search_context=context)
