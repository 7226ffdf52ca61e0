"""Say which rank failed when a multi-process run breaks, instead of a gloo/nccl traceback.

A dead rank shows in the others' next collective as a socket error ("Connection reset by peer"), a stuck one as a
timeout. Rank 0 under Lightning's launcher started the others, so it names which one died and how; another rank
names its peer when there is only one. DDP's "Expected to have finished reduction" becomes one line too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from project.errors import Preempted, RankFailure, RunFailure, UserError, first_line
from project.launch.ranks import RankProcess, how_it_ended
from project.launch.stop_signals import peer_stopped
from project.layers import first_answer
from project.lightning_private import launched_processes
from project.parallel.strategies import built_from_plan

if TYPE_CHECKING:
    import lightning as L

# How long rank 0 waits for a child that broke the connection to be reaped, so its exit code is known.
_REAP_WAIT_S = 3.0
# Error texts of gloo, nccl and the TCP store when a peer went away or a collective never completed.
_LOST_PEER = ("connection reset", "connection closed", "connection refused", "broken pipe", "socket closed")
_TIMED_OUT = ("timed out", "timeout")
# DDP's error at the step after a parameter got no gradient, and the words Lightning replaces it with.
_UNUSED_PARAMETERS = (
    "expected to have finished reduction in the prior iteration",
    "parameters that were not used in producing the loss",
)
# Rank 0 hosts the rendezvous store on MASTER_PORT; a port already taken fails its listen.
_PORT_IN_USE = ("failed to listen on any local network address", "address already in use")
#: Seconds a rank other than 0 waits to be stopped by its launcher before repeating the mistake rank 0 reports (a
#: launcher that does not stop them, or a mistake only this rank made).
DEFER_TO_RANK_ZERO_S = 10.0


class UnusedParametersError(UserError):
    """Trainable parameters got no gradient under DDP without ``find_unused_parameters``: one line, exit code 2."""


def parameters_without_gradient(module: nn.Module, ignored: Collection[str] = ()) -> list[str]:
    """Names of ``module``'s trainable parameters that have no ``.grad`` (after a backward: that got none)."""
    return [n for n, p in module.named_parameters() if p.requires_grad and p.grad is None and n not in ignored]


def uses_parallel_section(trainer: L.Trainer) -> bool:
    """Whether the run's strategy comes from the ``parallel`` section (built from its row), not ``trainer.strategy``."""
    return built_from_plan(trainer.strategy)


def unused_parameters_error(model: str, names: list[str], when: str, parallel: bool = True) -> UnusedParametersError:
    """The line for parameters of ``model`` (``names``, if known) that got no gradient in ``when``."""
    listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    subject = f"{len(names)} parameter(s) of {model} ({listed})" if names else f"a parameter of {model}"
    key = "parallel.ddp.find_unused_parameters: " if parallel else "trainer.strategy: ddp_find_unused_parameters_"
    return UnusedParametersError(
        f"{subject} got no gradient in {when}, and DDP needs one for every trainable parameter in every step "
        f"unless told otherwise; set `{key}true`, or freeze the parameters that are never trained (requires_grad=False)"
    )


def defer_to_rank_zero(trainer: L.Trainer) -> None:
    """On a rank other than 0 of several, wait for rank 0's launcher to stop it, so that rank 0 alone reports."""
    if trainer.world_size > 1 and trainer.global_rank != 0:
        time.sleep(DEFER_TO_RANK_ZERO_S)


def _unused_parameters(trainer: L.Trainer) -> UnusedParametersError:
    """DDP's "finished reduction" error, as the one line that names the setting (and the parameters when known)."""
    module = trainer.lightning_module
    automatic = module is None or module.automatic_optimization
    # Only automatic optimization surely leaves the last step's gradients in place (manual may have cleared them).
    names = parameters_without_gradient(module) if module is not None and automatic else []
    # DDP notices at the next forward (automatic), or at the next manual_backward.
    when = "the previous training step" if automatic else "an earlier backward pass (manual_backward)"
    defer_to_rank_zero(trainer)
    model = type(module).__name__ if module is not None else "the model"
    return unused_parameters_error(model, names, when, uses_parallel_section(trainer))


def _gist(error: BaseException) -> str:
    """The backend's own words without its source location: "[pair.cc:534] Connection closed by peer ..."."""
    return re.sub(r"^\[[^\]]*\]\s*", "", first_line(error)).split(". ")[0][:160]


def _failed_children(strategy: Any, wait_s: float) -> list[tuple[int, subprocess.Popen | RankProcess]]:
    """(local rank, process) of the ranks this process started (launched or forked) that ended with an error."""
    procs, deadline = launched_processes(strategy), time.monotonic() + wait_s
    while True:
        # Lightning's launcher lists local ranks 1..N-1 in order; a forked rank knows its own.
        failed = [(getattr(p, "local_rank", i + 1), p) for i, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed or not procs or time.monotonic() >= deadline:
            return failed
        time.sleep(0.05)


class PortInUseError(UserError):
    """The rendezvous port is taken: a setting to change, not a rank that died."""


def explain_rank_failure(
    error: BaseException,
    trainer: L.Trainer | None,
    timeout_s: float | None,
    timeout_name: str = "parallel.timeout_s",
    then: str = "then resume with `fit --ckpt_path last`",
) -> RunFailure | UserError | None:
    """A one-line :class:`RankFailure` for ``error`` if it is a lost or stuck rank, else ``None``.

    Call it before the launcher's children are stopped (the first to die is told apart); ``timeout_name`` holds
    ``timeout_s``; ``then`` is what to do once the cause is fixed.
    """
    world_size = getattr(trainer, "world_size", 1) if trainer is not None else 1
    error = _lost_rank_under(error)  # a checkpoint write that failed because a rank died names the rank, not the disk
    if world_size <= 1 or isinstance(error, (RunFailure, UserError)) or not isinstance(error, RuntimeError):
        return None
    text = str(error).lower()
    if any(s in text for s in _UNUSED_PARAMETERS):  # before the children: they stopped for the same reason
        return _unused_parameters(trainer)
    if any(s in text for s in _PORT_IN_USE):  # rank 0 could not host the rendezvous: no rank died
        return PortInUseError(
            f"MASTER_PORT={os.environ.get('MASTER_PORT', 'the rendezvous port')} is already in use on this machine "
            "(another run, or a process left over from one), so the rendezvous could not start; choose a free port, "
            "or unset MASTER_PORT and the launcher picks one"
        )
    lost, timed_out = any(s in text for s in _LOST_PEER), any(s in text for s in _TIMED_OUT)
    # A child that broke the connection is dead, or about to be reaped; a stuck one never exits.
    failed = _failed_children(trainer.strategy, _REAP_WAIT_S if lost else 0.0)
    if failed:
        return _children_failure(trainer, failed, lost, then)
    if not (lost or timed_out or isinstance(error, dist.DistError)):
        return None
    limit = f"{timeout_name}={timeout_s:g} s" if timeout_s is not None else "the process group's timeout"
    return _peer_failure(error, trainer.global_rank, world_size, (lost, timed_out), (limit, timeout_name), then)


def _children_failure(trainer: L.Trainer, failed: list[tuple[int, Any]], lost: bool, resume: str) -> RunFailure:
    """The line for ranks this one started that ended first: stopped by a signal, killed, or ended at a stall."""
    rank, first = trainer.global_rank, trainer.node_rank * trainer.num_devices
    if all(p.returncode == Preempted.exit_code for _, p in failed):  # stopped on a signal, not killed (not the OOM)
        return Preempted(peer_stopped(", ".join(f"rank {first + local} (pid {p.pid})" for local, p in failed)))
    names = ", ".join(f"rank {first + local} (pid {p.pid}) {how_it_ended(p.returncode)}" for local, p in failed)
    # That rank ended at its timeout, after a stall a layer recorded (the hang report names who was where).
    if lost and (stalled := first_answer("explain_stall", None)) is not None:
        return RankFailure(f"{stalled}; {names} at its timeout and rank {rank} stopped the others, {resume}")
    return RankFailure(
        f"{names}; rank {rank} stopped the other ranks of this run. Read that rank's output above "
        f"(a SIGKILL nobody sent is often the out-of-memory killer: see `dmesg`), {resume}"
    )


def _peer_failure(
    error: BaseException, rank: int, world_size: int, how: tuple[bool, bool], timeout: tuple[str, str], resume: str
) -> RankFailure:
    """The line for a peer this rank did not start: ``how`` is (lost, timed out); ``timeout`` (its text, setting)."""
    (lost, timed_out), (limit, timeout_name) = how, timeout
    peer = f"rank {1 - rank}" if world_size == 2 else "another rank (the launcher's report names it)"
    detail = _gist(error)
    # The peer ended at its timeout, after a stall a layer recorded (the hang report names who was where).
    if lost and (stalled := first_answer("explain_stall", None)) is not None:
        return RankFailure(f"{stalled}; {peer} ended at its timeout ({detail}), {resume}")
    if timed_out and not lost:
        stalled = first_answer("explain_stall", f"rank {rank}: a collective did not complete within {limit} ({detail})")
        if stalled is not None:
            return RankFailure(
                f"rank {rank}: a collective did not complete within {limit}; {stalled}. Fix the code it names, or "
                f"raise {timeout_name} if ranks legitimately do long uneven work, {resume}"
            )
        return RankFailure(
            f"rank {rank}: a collective did not complete within {limit}; {peer} is stuck or far behind "
            f"({detail}). Find what it waits for (e.g. `py-spy dump --pid PID`), or raise {timeout_name} "
            f"if ranks legitimately do long uneven work, {resume}"
        )
    return RankFailure(
        f"rank {rank} lost {peer} during a collective: that rank died or was killed ({detail}). "
        f"Read its output or the launcher's report for why, {resume}"
    )


def _lost_rank_under(error: BaseException) -> BaseException:
    """The lost peer under a failed background checkpoint write (a rank died, not the disk), else ``error``."""
    if not isinstance(error, RunFailure) or isinstance(error, (RankFailure, Preempted)):
        return error
    cause = error.__cause__
    while cause is not None:
        if any(s in str(cause).lower() for s in _LOST_PEER):
            return cause if isinstance(cause, RuntimeError) else RuntimeError(str(cause))
        cause = cause.__cause__ or cause.__context__
    return error


def error_from_worker(error: BaseException) -> BaseException | None:
    """The template's own error raised in a forked or spawned worker (``scenario: fork``), as that error again."""
    if not isinstance(error, mp.ProcessRaisedException):
        return None
    # A ProcessRaisedException holds the worker's traceback as text, ending "module.Class: message".
    if (found := re.match(r"^([\w.]+)\.(\w+): (.*)$", str(error).strip().splitlines()[-1])) is None:
        return None
    module, name, message = found.groups()
    # Looked up among the modules already imported, never imported: a multi-line message could name any module.
    cls = getattr(sys.modules.get(module), name, None)
    return cls(message) if isinstance(cls, type) and issubclass(cls, (UserError, RunFailure)) else None
