"""A hang names itself: every rank's stacks and last collectives land in ``<run>/hang/``, one line names the culprit.

Four real 2-process fits over gloo with ``--parallel.timeout_s 30``, each stalled on purpose by plain Lightning
code (tests/hang_faults.py, chosen by ``HANG_FAULT``): rank 1 sleeps inside ``training_step`` at step 30; rank 1
calls a barrier rank 0 never calls; rank 1's DataLoader worker blocks in ``__getitem__``; rank 0 stalls in a
callback's ``on_validation_epoch_end``. They mostly wait out the timeout, so the module starts all four at once
(about one timeout of wall time for the four) and the tests read their results.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import CompletedProcess
from threading import Event, Thread

import pytest
import torch

from helpers import CPU_DDP, DIGITS, FAST, free_port, run_cli, run_dirs

pytestmark = pytest.mark.distributed

TIMEOUT_S = 30
#: The issue's bound: every process gone within the timeout + 45 s of the stall.
AFTER_STALL_S = TIMEOUT_S + 45
FIT = [
    *("fit", "--config", DIGITS, "--config", CPU_DDP, "--config", FAST, "--trainer.max_epochs", "4"),
    *("--model.class_path", "hang_faults.HangingClassifier", "--data.class_path", "hang_faults.HangingDigits"),
    *("--trainer.callbacks+=hang_faults.StallInCallback", "--parallel.timeout_s", str(TIMEOUT_S)),
]
#: The drill: ``check`` with the last rank stalled on purpose (its timeout is the check's --join_timeout_s).
DRILL = ["check", "--config", DIGITS, "--config", CPU_DDP, "--hang-drill", "--join_timeout_s", str(TIMEOUT_S)]
#: fault -> (the stalled rank, the user function its stacks show, what the last error line says of it)
CASES = {
    "train_step": (
        1,
        "training_step",
        r"rank 1 is stuck in `hang_faults\.py:\d+ stall_forever` \(called from "
        r"`hang_faults\.py:\d+ training_step`\) \(training step 30; not in a collective\); rank 0 waits "
        r"in all_reduce #\d+ \(DDP gradients",
    ),
    "barrier": (
        1,
        "training_step",
        r"collective mismatch: rank 0 waits in all_reduce #(\d+) .*; rank 1 waits in "
        r"barrier #\1 .* at `hang_faults\.py:\d+ training_step`",
    ),
    "worker": (
        1,
        "__getitem__",
        r"rank 1 is stuck in `torch/utils/data/dataloader\.py:\d+ \w+` .*not in a "
        r"collective\); its DataLoader worker pid \d+ is in `hang_faults\.py:\d+ stall_forever` \(called "
        r"from `hang_faults\.py:\d+ __getitem__`\)",
    ),
    "val_end": (
        0,
        "on_validation_epoch_end",
        r"rank 0 is stuck in `hang_faults\.py:\d+ stall_forever` \(called "
        r"from `hang_faults\.py:\d+ on_validation_epoch_end`\).*not in a collective\); rank 1 waits in",
    ),
}


@dataclass
class HungRun:
    """One stalled fit: its result, when it stalled and ended, its run directory, what its processes listened on."""

    result: CompletedProcess[str]
    stalled_at: float
    ended: float
    run_dir: Path
    master_port: int
    left_alive: list[int]
    listening: set[tuple[str, int]] = field(default_factory=set)


def tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``HANG_RUN=tag``: the ranks and their workers."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            mine = proc.name.isdigit() and f"HANG_RUN={tag}".encode() in (proc / "environ").read_bytes().split(b"\0")
            if not mine:
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(proc.name))
        except OSError:  # ended while we looked, or not ours to read
            continue
    return found


def listening_sockets(pids: list[int]) -> set[tuple[str, int]]:
    """(address in /proc's hex, port) of every TCP socket in LISTEN state that one of ``pids`` holds."""
    found = set()
    for pid in pids:
        try:
            inodes = {os.readlink(fd)[8:-1] for fd in Path(f"/proc/{pid}/fd").iterdir()}
            for table in ("tcp", "tcp6"):
                for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                        address, port = fields[1].split(":")
                        found.add((address, int(port, 16)))
        except OSError:
            continue
    return found


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or ::ffff:127.x.x.x, written as /proc/net/tcp{,6} writes them (little-endian words)."""
    if len(address) == 8:
        return address.endswith("7F")
    return address == "00000000000000000000000001000000" or (
        address[:24] == "0000000000000000FFFF0000" and (address[30:32] == "7F")
    )


def hang_run(root: Path, fault: str) -> HungRun:
    """Run the stalled fit (or the drill) in a folder of its own, watching which sockets its processes listen on."""
    folder, tag, port = root / fault, uuid.uuid4().hex, free_port()
    folder.mkdir()
    stamp = folder / "stalled_at"
    env = {"HANG_FAULT": fault, "HANG_STAMP": str(stamp), "HANG_RUN": tag, "MASTER_PORT": str(port)}
    listening: set[tuple[str, int]] = set()
    done = Event()

    def watch() -> None:
        while not done.wait(1.0):
            listening.update(listening_sockets(tagged(tag)))

    watcher = Thread(target=watch, daemon=True)
    watcher.start()
    result = run_cli(DRILL if fault == "drill" else FIT, folder, env=env, timeout=600)
    ended = time.time()
    done.set()
    watcher.join()
    if fault == "drill":
        return HungRun(result, ended, ended, folder, port, tagged(tag), listening)
    assert stamp.is_file(), f"{fault}: the stall never happened:\n{result.stderr[-3000:]}"
    return HungRun(result, float(stamp.read_text()), ended, run_dirs(folder)[-1], port, tagged(tag), listening)


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HungRun]:
    """The four stalled fits and ``check --hang-drill``, started at once (each mostly waits for its timeout)."""
    root = tmp_path_factory.mktemp("hang")
    with ThreadPoolExecutor(max_workers=len(CASES) + 1) as pool:
        runs = {fault: pool.submit(hang_run, root, fault) for fault in [*CASES, "drill"]}
        return {fault: run.result() for fault, run in runs.items()}


@pytest.mark.parametrize("fault", list(CASES))
def test_a_stall_ends_the_job_and_names_the_stalled_rank_and_where(hung, fault):
    run, (rank, function, said) = hung[fault], CASES[fault]
    stderr = run.result.stderr
    assert run.result.returncode != 0, stderr[-3000:]
    assert run.left_alive == [], f"processes of the run are still alive: {run.left_alive}"
    assert run.ended - run.stalled_at < AFTER_STALL_S, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last_error = [line for line in stderr.splitlines() if line.startswith("error: ")][-1]
    assert re.search(said, last_error), last_error
    assert f"{run.run_dir.relative_to(run.run_dir.parents[2]) / 'hang'}" in last_error, last_error
    hang = run.run_dir / "hang"
    assert {"rank0.txt", "rank1.txt", "rank0.json", "rank1.json", "summary.txt"} <= {p.name for p in hang.iterdir()}
    assert re.search(said, (hang / "summary.txt").read_text().splitlines()[0])
    stalled = (hang / f"rank{rank}.txt").read_text()
    assert f"in {function}" in stalled and "hang_faults.py" in stalled, stalled[:3000]
    assert "last collectives" in stalled and " done " in stalled  # the Flight Recorder's ring, read at the stall


def test_the_previous_checkpoint_is_intact(hung):
    """Step 30 is in epoch 3: the epoch-end saves before it load, and the stall wrote no checkpoint of its own."""
    last = hung["train_step"].run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert 0 < checkpoint["global_step"] <= 30


def test_nothing_listens_beyond_loopback_but_the_rendezvous(hung):
    """The hang report talks over the rendezvous store and serves nothing: every listening socket of every run's
    processes is on loopback (gloo's pairs), except the rendezvous store itself on MASTER_PORT, which torch's
    TCPStore binds on every interface."""
    for fault, run in hung.items():
        assert run.listening, f"{fault}: no listening socket seen; the sampling missed the run"
        public = {(address, port) for address, port in run.listening if not is_loopback(address)}
        assert {port for _, port in public} <= {run.master_port}, f"{fault}: {public}"


def test_the_hang_drill_shows_the_report_a_real_stall_gives(hung):
    """``check --hang-drill``: the last rank stalls on purpose; the summary is printed, the run ends as a hang does."""
    run = hung["drill"]
    assert run.result.returncode == 1, run.result.stderr[-3000:]
    assert "Traceback" not in run.result.stderr, run.result.stderr[-3000:]
    last_error = [line for line in run.result.stderr.splitlines() if line.startswith("error: ")][-1]
    said = (
        r"rank 1 is stuck in `hang_drill\.py:\d+ stall_on_purpose` .*; rank 0 waits in all_reduce #\d+ \(DDP gradients"
    )
    assert re.search(f"--join_timeout_s={TIMEOUT_S} s; {said}", last_error), last_error
    assert "hang drill: rank 1 stalls in training step 4 on purpose" in run.result.stdout
    summary = (run.run_dir / "hang" / "summary.txt").read_text()
    assert re.search(said, summary) and summary in run.result.stdout.replace("\r", "")
    assert {"rank0.txt", "rank1.txt"} <= {p.name for p in (run.run_dir / "hang").iterdir()}
    assert not (run.run_dir / "logs").exists()  # check writes no run directory, drill or not
