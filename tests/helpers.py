"""Helpers shared by the tests: run the CLI as a user would, and read what a run left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

# Re-exported: the tests read runs with the same function the notebooks use.
from project.runs import read_scalars as read_scalars

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
DIGITS = str(CONFIGS / "digits.yaml")
CPU_DDP = str(CONFIGS / "parallel" / "cpu_ddp.yaml")
FAST = str(REPO / "tests" / "configs" / "fast.yaml")

T = TypeVar("T")


def free_port() -> int:
    """A free TCP port on localhost (for MASTER_PORT / rendezvous endpoints)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a CLI subprocess: the test helpers importable, no inherited launcher variables."""
    # A suite run inside a SLURM job or a torchrun worker must not make every CLI run think it was launched so.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PL_", "LOCAL_RANK", "TORCHELASTIC", "SLURM_"))}
    for key in ("RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.update(extra or {})
    return env


def run_cli(
    args: Sequence[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    module: Sequence[str] = ("-m", "project"),
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m project ARGS`` in ``cwd`` (so ``logs/`` lands there) and capture its output."""
    return subprocess.run(
        [sys.executable, *module, *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def two_at_a_time(*calls: Callable[[], T]) -> list[T]:
    """Run independent calls (each running CLI commands) two at a time, in threads; their results in order.

    A CLI command spends its first seconds importing on one core, so on 2 cores two side by side take
    little longer than one. Only for calls that share no folder and assert no timing.
    """
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def run_dirs(cwd: Path, name: str = "digits") -> list[Path]:
    """Run directories ``logs/<name>/version_<n>`` under ``cwd``, oldest first."""
    root = cwd / "logs" / name
    if not root.is_dir():
        return []
    return sorted(root.glob("version_*"), key=lambda p: int(p.name.split("_")[1]))


def read_plan(run_dir: Path) -> dict:
    """The ``plan.json`` a fit wrote."""
    return json.loads((run_dir / "plan.json").read_text())


def assert_clean_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A user error: non-zero exit, one ``error:`` line naming ``needles``, no traceback."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    for needle in needles:
        assert needle in output, f"{needle!r} not in:\n{output}"


def descendants(pid: int) -> list[int]:
    """The processes started from ``pid``, at any depth (Linux ``/proc``), even those in sessions of their own."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_tree(*processes: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Stop daemons a test started and every process they started: SIGTERM, then SIGKILL after ``grace_s``.

    The tree is collected first, because a daemon that dies orphans its children (a Ray worker, a slurmstepd).
    """
    pids = [pid for p in processes for pid in (p.pid, *descendants(p.pid))]
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            for process in processes:
                process.poll()  # reap our own children; init reaps the orphans
            pids = [pid for pid in pids if _running(pid)]
            time.sleep(0.2)
        if not pids:
            return


def file_hashes(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the SHA-256 of its content: what "nothing removed or overwritten" compares."""
    import hashlib

    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }
