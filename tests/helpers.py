"""Helpers shared by the tests: run the CLI as a user would, and read what a run left behind."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import yaml

# Re-exported: the tests read runs with the same function the notebooks use.
from project.checkpoints.atomic import atomic_write_text
from project.runs import read_scalars as read_scalars

try:  # the early layer forks a CPU run's ranks after the imports; without it Lightning's launcher starts them
    from project.extras.early.preparse import processes_to_start
except ImportError:  # stripped (make strip EXTRAS=early)

    def processes_to_start(argv: Sequence[str]) -> int | None:
        """Nothing is forked after the imports: Lightning's launcher starts every rank."""
        return None


REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
DIGITS = str(CONFIGS / "digits.yaml")
CPU_DDP = str(CONFIGS / "parallel" / "cpu_ddp.yaml")
FAST = str(REPO / "tests" / "configs" / "fast.yaml")

T = TypeVar("T")


def has_layer(name: str) -> bool:
    """Whether the layer ``name`` is in this checkout (``make strip`` removes its folder): a core test's case skips."""
    return (REPO / "project" / "extras" / name / "layer.py").is_file()


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
    # mlflow.set_tracking_uri (Lightning's MLFlowLogger calls it) exports the URI into this process's environment:
    # a tracking test run in-process here must not send every later CLI run's tracking to its store.
    env.pop("MLFLOW_TRACKING_URI", None)
    # A layer's test support modules (tests/extras/<layer>/hang_faults.py) are named by class path as tests/'s are.
    layers = [str(p) for p in sorted((REPO / "tests" / "extras").glob("*")) if p.is_dir() and p.name[0] not in "_."]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), *layers, str(REPO), env.get("PYTHONPATH", "")])
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
    """Run ``python -m project ARGS`` in ``cwd`` (so ``logs/`` lands there) and capture its output.

    A run that is sure to stay one process, in the suite's own environment, is forked from a process that
    already imported the CLI (``fork_cli.py``: the same command in a process of its own, without the 4 s of
    imports); any other run, and every run under ``TESTS_FRESH_CLI=1``, starts a fresh interpreter.
    """
    if not env and tuple(module) == ("-m", "project") and forkable(args):
        result = _fork_server().run(list(args), cwd, timeout)
        if result is not None:
            return result
    return subprocess.run(
        [sys.executable, *module, *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------------- one-process runs, forked
FRESH_ENV = "TESTS_FRESH_CLI"
_COMMANDS = ("fit", "validate", "test", "predict", "plan", "check", "consolidate")
# Options that can make a run more than one process, or that print and exit before the command.
_LAYOUT_OPTIONS = (
    "--parallel",
    "--parallel.devices",
    "--parallel.num_nodes",
    "--parallel.launcher",
    "--parallel.scenario",
    "--trainer",
    "--trainer.devices",
    "--trainer.num_nodes",
    "--trainer.strategy",
    "--trainer.accelerator",
)


_GPU_POSSIBLE = bool(os.environ.get("CUDA_VISIBLE_DEVICES")) or any(Path("/dev").glob("nvidia[0-9]*"))


def forkable(args: Sequence[str]) -> bool:
    """Whether ``python -m project ARGS`` can be forked from the imported server: a run sure to stay one process
    (a command, and no option or config file that sets a layout), or one whose CPU ranks ``python -m project``
    forks itself after its imports (the early layer's ``processes_to_start``), which it does the same in
    a forked child. Every other layout (Lightning's launcher, torchrun, nodes, GPUs) starts fresh interpreters,
    as a user's does."""
    if os.environ.get(FRESH_ENV, "") not in ("", "0") or not args or args[0] not in _COMMANDS:
        return False
    if processes_to_start(args) is not None:
        return True
    if args[0] in ("plan", "consolidate"):
        return True  # they start no process, whatever the layout
    for i, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name in _LAYOUT_OPTIONS or name.startswith(("-h", "--help", "--print_config")):
            return False
        if name in ("-c", "--config"):
            if not equals:
                value = args[i + 1] if i + 1 < len(args) else ""
            if not _one_process_config(value):
                return False
    return True


def _one_process_config(value: str) -> bool:
    """A config file whose ``parallel`` and ``trainer`` sections set no layout (devices, nodes, launcher, strategy)."""
    try:
        data = yaml.safe_load(Path(value).read_text())
    except (OSError, yaml.YAMLError):
        return False  # not a file (inline, missing) or not YAML: the fresh interpreter says so
    if not isinstance(data, dict):
        return False
    parallel, trainer = data.get("parallel") or {}, data.get("trainer") or {}
    if not isinstance(parallel, dict) or not isinstance(trainer, dict):
        return False
    one_device = ("cpu",) if _GPU_POSSIBLE else ("auto", "cpu")  # `auto` takes every GPU it sees
    if {"devices", "num_nodes", "launcher"} & set(parallel) or parallel.get("scenario", "auto") not in one_device:
        return False
    return not {"devices", "num_nodes", "strategy", "accelerator"} & set(trainer)


class ForkServer:
    """The client of ``fork_cli.py``: one server per test session, runs from any thread."""

    def __init__(self) -> None:
        self.env = cli_env()
        self.same_env = _settled(self.env)
        self.folder = Path(tempfile.mkdtemp(prefix="fork_cli-"))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fork_cli"],
            cwd=self.folder,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(self.folder / "server.err").open("w"),
            text=True,
        )
        self.lock = threading.Lock()
        self.waiting: dict[str, dict] = {}
        self.count = 0
        threading.Thread(target=self._answers, daemon=True).start()

    def _answers(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            answer = json.loads(line)
            slot = self.waiting[answer["id"]]
            slot["status"] = answer["status"]
            slot["done"].set()
        with self.lock:  # the server ended: nothing more will be answered
            self.dead = True
            for slot in self.waiting.values():
                slot["done"].set()

    dead = False

    def _send(self, message: dict) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def run(self, args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str] | None:
        """``python -m project ARGS`` in ``cwd``, forked; ``None`` if the server is gone (then run it fresh)."""
        with self.lock:
            if self.dead:
                return None
            self.count += 1
            rid = str(self.count)
            slot = self.waiting[rid] = {"done": threading.Event(), "status": None}
            out, err = self.folder / f"{rid}.out", self.folder / f"{rid}.err"
            try:
                self._send({"id": rid, "args": args, "cwd": str(Path(cwd).resolve()), "out": str(out), "err": str(err)})
            except OSError:  # the server ended (it could not import the CLI): run it fresh
                self.dead = True
                return None
        command = [sys.executable, "-m", "project", *args]
        finished = slot["done"].wait(timeout)
        if not finished:
            with self.lock, contextlib.suppress(OSError):
                self._send({"kill": rid})
            slot["done"].wait(30)
        if slot["status"] is None and finished:
            return None
        stdout, stderr = (p.read_text() if p.exists() else "" for p in (out, err))
        for path in (out, err):
            path.unlink(missing_ok=True)
        if not finished:
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(command, slot["status"], stdout, stderr)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)
        shutil.rmtree(self.folder, ignore_errors=True)


def _settled(env: dict[str, str]) -> dict[str, str]:
    """The environment but pytest's PYTEST_CURRENT_TEST, which names each test as it runs."""
    return {key: value for key, value in env.items() if key != "PYTEST_CURRENT_TEST"}


_server: list[ForkServer] = []
_server_lock = threading.Lock()


def _fork_server() -> ForkServer:
    """The session's server, started on first use and again if the environment changed (a test's monkeypatch)."""
    with _server_lock:
        if not _server or _server[-1].dead or _server[-1].same_env != _settled(cli_env()):
            if _server:
                _server[-1].close()
            _server.append(ForkServer())
            atexit.register(_server[-1].close)
        return _server[-1]


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


def every_10_steps() -> str:
    """``configs/digits.yaml`` whose ``last.ckpt`` is also saved every 10 optimizer steps: kill points are steps here.

    The config's own rule is by time (``TimedCheckpoint(every_s=60)``, tested in ``test_timed_checkpoint.py``);
    steps make the checkpoint a killed run resumes from known in advance. The file's name is its content's hash.
    """
    text = Path(DIGITS).read_text().replace("every_s: 60\n", "every_s: 60\n        every_n_steps: 10\n")
    assert "every_n_steps: 10" in text, "configs/digits.yaml no longer has TimedCheckpoint(every_s: 60)"
    path = Path(tempfile.gettempdir()) / f"digits-every-10-steps-{hashlib.sha1(text.encode()).hexdigest()[:12]}.yaml"
    if not path.exists():
        atomic_write_text(path, text)
    return str(path)
