"""jsonargparse's stub resolver, told this interpreter's ``sys.path`` instead of asking a new one.

jsonargparse reads type stubs (through typeshed_client) for parameters without annotations, and
typeshed_client's default search context starts ``python -c 'print(sys.path)'`` to learn the path. That
child costs every process of every command a second interpreter start, and when a rank is stopped while it
waits (a refusal on rank 0 stops the forked ranks), the orphan prints a ``BrokenPipeError`` traceback into
the run's stderr. The same interpreter is already running here, so its own path is the answer.
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
