"""A start-up cache for one-process CLI runs in the tests: ``python -m fork_cli`` imports what ``python -m project``
imports once, then forks one child per run, which runs ``project/__main__.py`` exactly as ``python -m project``
would, in its own process: its own folder, arguments, stdout, stderr and exit status (a signal that kills it is
seen as by ``subprocess``). Each CLI start otherwise spends about 4 s of CPU importing torch and Lightning.

Forking after the imports is what the template's early layer does itself for the ranks of a CPU run:
nothing has run yet, so no thread pool, process group or device is shared. ``helpers.run_cli`` sends only runs
that are sure to stay one process and need no environment of their own here (``helpers.forkable``); everything
else, and everything with ``TESTS_FRESH_CLI=1``, starts a fresh interpreter.

Protocol, one JSON object per line: requests on stdin ``{"id", "args", "cwd", "out", "err"}`` (output files) or
``{"kill": id}``; answers on stdout ``{"id", "status"}`` (``os.waitstatus_to_exitcode``). EOF on stdin ends it.
"""

from __future__ import annotations

import gc
import json
import os
import random
import runpy
import selectors
import signal
import sys

# What project/__main__.py imports before it runs a command (the rest of a run's imports follow from these).
import project.cli
import project.commands  # noqa: F401
from project.layers import hooks

hooks("around_command")  # the layers' wraps of the command (the early layer's fork), imported as __main__ does


def _child(request: dict) -> None:
    """Become ``python -m project ARGS`` in ``cwd``: this never returns (the command's SystemExit ends it)."""
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (fd 0 is now /dev/null, as the interpreter's own stdin)
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # `python -m` puts the working folder first
    random.seed()  # a fresh interpreter's own seed, not the server's
    sys.argv = ["-m", *request["args"]]  # run_module sets argv[0] to project/__main__.py, as `-m` does
    runpy.run_module("project", run_name="__main__", alter_sys=True)
    sys.exit(0)  # through the interpreter's normal exit: atexit handlers and flushes run as in a fresh process


def main() -> None:
    gc.freeze()  # the imported objects stay out of the children's collections: fewer copy-on-write pages
    children: dict[int, str] = {}  # pid -> request id
    pids: dict[str, int] = {}
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    answers = sys.stdout

    def reap() -> None:
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            rid = children.pop(pid, None)
            if rid is not None:
                pids.pop(rid, None)
                answers.write(json.dumps({"id": rid, "status": os.waitstatus_to_exitcode(status)}) + "\n")
                answers.flush()

    pending = b""
    while True:
        if selector.select(timeout=0.05):
            data = os.read(0, 65536)  # not sys.stdin: its buffer would hide a second line from select
            if not data:
                break
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                if "kill" in request:
                    if request["kill"] in pids:
                        os.kill(pids[request["kill"]], signal.SIGKILL)
                    continue
                answers.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    _child(request)
                children[pid] = request["id"]
                pids[request["id"]] = pid
        reap()
    for pid in children:
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
