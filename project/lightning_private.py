"""Every use of a private Lightning or torch name, in one place, with the public API that is missing.

Importing this module imports nothing from Lightning (``project.export`` uses it in plain processes);
``tests/unit/test_lightning_private.py`` fails loudly when a Lightning upgrade moves any of these.

1. The processes Lightning's launcher started for ranks 1..N-1 (``_SubprocessScriptLauncher.procs``), with those
   rank 0 started itself (:mod:`project.launch.ranks`): to name the rank that died first and stop the others when
   rank 0 fails (Lightning kills them only on Ctrl+C).
2. The name of Fabric's module wrapper (``_FabricModule``, holding the module at ``_forward_module``),
   which ``project.export.unwrap`` sees through by class name, so that it never imports Lightning. (The
   Trainer wraps a LightningModule in DDP itself, which ``unwrap`` handles as plain torch.)
3. (No longer: the mesh sizes of ``ModelParallelStrategy`` go through its constructor, from the plan's layout.)
4. Not a name but a behaviour: the Trainer calls a callback's hook only when ``callable(getattr(callback, hook))``;
   ``project.callbacks.dispatch.skip_idle_batch_hooks`` sets empty per-batch hooks to ``None`` (no public way).
5. The version a TensorBoard/CSV logger has not chosen yet (``_version is None``) and the next free one
   (``_get_next_version()``, a listing of the run name's folder). Lightning picks the version by listing, so two
   runs started at once pick the same folder; :func:`project.runs.reserve_run_directory` creates the folder
   atomically instead and gives the logger that version (there is no public setter).
6. A callback's state key: ``Callback._generate_state_key(**kwargs)`` is how Lightning's own ``ModelCheckpoint``
   names its state in a checkpoint; the template's checkpoint callbacks use it so that their state sits under
   Lightning's key format (:func:`state_key`).
8. Lightning's per-step SIGTERM check: before every training step of a multi-process fit its training loop
   broadcasts rank 0's "SIGTERM received" flag (``_broadcast_sigterm_tensor``: a collective and a host sync per
   step). The template agrees on a stop without it (:mod:`project.callbacks.preemption`), so
   :func:`skip_sigterm_broadcast` replaces that method on the run's loop with one that does nothing.
7. torch, not Lightning: a learning-rate scheduler's ``_last_lr`` (what ``get_last_lr()`` returns), set again
   after the plan scales the rates (:func:`set_last_lr`); a module compiled in place keeps its compiled call in
   ``_compiled_call_impl`` (:func:`compiled_call`, :func:`drop_compiled_call`); a sharded checkpoint folder is
   merged in one process with ``torch.distributed.checkpoint``'s ``_load_state_dict`` and
   ``_EmptyStateDictLoadPlanner`` (what its public ``dcp_to_torch_save`` uses; that function reads without the
   template's pickle policy): :func:`load_without_process_group`, :data:`EMPTY_LOAD_PLANNER`.
9. What the sanity check logged per validation loader: ``trainer._results`` (each ``self.log`` call's name and
   loader index). With several loaders ``callback_metrics`` holds none of them until the first real validation,
   so a monitor on ``val/mse/dataloader_idx_0`` could not be proven before training (:func:`logged_per_loader`).
10. The checkpoint dump without its write: ``trainer._checkpoint_connector.dump_checkpoint``. A survivor of a lost
   peer in an elastic job saves alone, with no collective (:func:`dump_checkpoint`).
11. torch's Flight Recorder, read in memory: ``torch._C._distributed_c10d._dump_fr_trace_json`` (the NCCL build's
   ``_dump_nccl_trace_json``), every collective of this process in a ring; torch's public reader only parses the
   files a crash handler dumps. The hang report reads it at a stall (:func:`flight_recorder_json`); and a Lightning
   strategy's process-group timeout, ``_timeout`` (:func:`process_group_timeout_s`), its stall threshold's base.
12. torch's, each without a public accessor: the default group's store (:func:`default_store`, the hang watcher's
   hand-over); torch.compile's ``_orig_mod``; DCP's metadata globals (the loading policy allows them); autograd's
   ``_engine_run_backward`` frame; an LR scheduler's marks on the optimizer ZeRO replaces and SequentialLR's
   ``_schedulers`` (:func:`mark_scheduler_steps`); Lightning's ``_batches_that_stepped`` in a checkpoint.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any

from project.launch.ranks import RankProcess, started_ranks, stop_started_ranks

#: Fabric's wrapper class, which holds the wrapped module at ``_forward_module``.
WRAPPER_CLASS_NAMES = frozenset({"_FabricModule"})
#: Where those wrappers keep the module they wrap.
WRAPPER_ATTRIBUTE = "_forward_module"
#: torch.compile's OptimizedModule holds the module it compiled here.
COMPILED_ATTRIBUTE = "_orig_mod"
#: (module, name) of torch.distributed.checkpoint's private globals pickled in a sharded folder's ``.metadata``.
_DCP = "torch.distributed.checkpoint"
CHECKPOINT_PRIVATE_GLOBALS = frozenset(
    {
        (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"),
        (f"{_DCP}.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
    }
)
#: Autograd's backward frame: a collective under it is DDP's gradient all-reduce.
AUTOGRAD_BACKWARD_FRAME = "_engine_run_backward"
#: Lightning's count of the batches whose optimizer stepped, in a checkpoint's ``epoch_loop.state_dict``.
BATCHES_STEPPED_KEY = "_batches_that_stepped"
#: The launcher class whose ``procs`` are the processes it started (checked by the test).
SUBPROCESS_LAUNCHER = "lightning.pytorch.strategies.launchers.subprocess_script._SubprocessScriptLauncher"


def launched_processes(strategy: Any) -> list[subprocess.Popen | RankProcess]:
    """The processes (ranks 1..N-1 of this node) that Lightning's launcher started or this one forked; else ``[]``."""
    launcher = getattr(strategy, "launcher", None)
    return [*(getattr(launcher, "procs", None) or []), *started_ranks()]


def stop_launched_processes(strategy: Any) -> None:
    """SIGKILL the ranks this process started, by either way (when rank 0 fails they would wait forever)."""
    launcher = getattr(strategy, "launcher", None)
    if getattr(launcher, "procs", None) and hasattr(launcher, "kill"):
        launcher.kill(signal.SIGKILL)
    stop_started_ranks()


def unchosen_version(logger: Any) -> int | None:
    """The next free version by the logger's own listing, if it has not chosen one yet; ``None`` if it has."""
    if getattr(logger, "_version", 0) is not None or not callable(getattr(logger, "_get_next_version", None)):
        return None
    return int(logger._get_next_version())


def choose_version(logger: Any, version: int) -> None:
    """Make ``logger`` use ``version`` (its ``log_dir`` becomes ``<root_dir>/version_<version>``)."""
    logger._version = version


def state_key(callback: Any, **kwargs: Any) -> str:
    """Lightning's state key of ``callback`` with these distinguishing arguments (as ``ModelCheckpoint`` makes it)."""
    return str(callback._generate_state_key(**kwargs))


def set_last_lr(scheduler: Any) -> None:
    """Make a scheduler's ``get_last_lr()`` say its optimizer's current rates (after they were scaled)."""
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def compiled_call(module: Any) -> Any:
    """The compiled forward of a module compiled in place (``nn.Module.compile``); ``None`` when it is not."""
    return getattr(module, "_compiled_call_impl", None)


def drop_compiled_call(module: Any) -> None:
    """Make a module compiled in place (a copy of one) run its eager forward again."""
    module._compiled_call_impl = None


def load_without_process_group(state: dict[str, Any], reader: Any, planner: Any) -> None:
    """Read a ``torch.distributed.checkpoint`` folder into ``state`` in this process alone (no process group)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)


def __getattr__(name: str) -> Any:
    """``EMPTY_LOAD_PLANNER``: torch's planner that loads a checkpoint into an empty state dict (imported when used)."""
    if name == "EMPTY_LOAD_PLANNER":
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

        return _EmptyStateDictLoadPlanner
    raise AttributeError(name)


def keep_own_signal_handlers(trainer: Any) -> None:
    """Make the Trainer register no signal handlers of its own for this run (nor restore any at its teardown).

    Its SIGTERM handler broadcasts a tensor from inside the handler (a collective only the signalled rank joins)
    and its teardown puts back the handlers it found; the template's stay from the first instant to the last.
    """
    connector = trainer._signal_connector
    connector.register_signal_handlers = lambda: None
    connector.teardown = lambda: None


def skip_sigterm_broadcast(trainer: Any) -> None:
    """Stop the training loop's per-step broadcast of Lightning's SIGTERM flag (the template agrees without it)."""
    loop = trainer.fit_loop.epoch_loop
    if hasattr(loop, "_broadcast_sigterm_tensor"):
        loop._broadcast_sigterm_tensor = lambda: None


def flight_recorder_json() -> str | None:
    """Torch's Flight Recorder (every collective of this process, in a ring) as JSON; ``None`` when it is off.

    Its dump is private (``torch._C._distributed_c10d._dump_fr_trace_json``, or the NCCL build's
    ``_dump_nccl_trace_json``); the public tool reads only the files a crash handler wrote. Read by the hang
    report (the resilience layer's), never per step.
    """
    from torch._C import _distributed_c10d as c10d

    for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
        dump = getattr(c10d, name, None)
        if dump is not None:
            try:
                text = dump(True, False)  # (include collectives, only active ones)
            except RuntimeError:  # this build's recorder is off (its ring has no entries to give)
                continue
            text = text.decode() if isinstance(text, bytes) else text
            return text if '"entries"' in text else None
    return None


def process_group_timeout_s(strategy: Any) -> float | None:
    """The process-group timeout a Lightning DDP/model-parallel strategy was built with (``_timeout``), in seconds."""
    timeout = getattr(strategy, "_timeout", None)
    return timeout.total_seconds() if timeout is not None else None


def logged_per_loader(trainer: Any) -> dict[str, set[int]]:
    """What the last evaluation logged with a loader index: metric name -> the loaders' indices (``trainer._results``).

    With several validation loaders Lightning puts no ``<name>/dataloader_idx_<i>`` into ``callback_metrics`` during
    the sanity check (only from the first real validation on); its result collection holds each ``self.log`` call's
    name and loader. Read once after the sanity check (:mod:`project.callbacks.checks`).
    """
    found: dict[str, set[int]] = {}
    for result in (getattr(trainer, "_results", None) or {}).values():
        meta = getattr(result, "meta", None)
        if meta is not None and meta.add_dataloader_idx and meta.dataloader_idx is not None:
            found.setdefault(meta.name, set()).add(int(meta.dataloader_idx))
    return found


def dump_checkpoint(trainer: Any) -> dict[str, Any]:
    """The full training checkpoint of this moment, built by the Trainer's checkpoint connector (nothing written).

    ``trainer.save_checkpoint`` builds it the same way and then writes on rank 0 and meets the others in a barrier;
    a survivor of a lost peer (the resilience layer's elastic save) writes it alone, so it needs the dump without
    the write (``_checkpoint_connector.dump_checkpoint``: no public accessor).
    """
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)


def default_store() -> Any:
    """The default process group's store (torch's ``_get_default_store``): the rendezvous every rank reaches."""
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def strategy_timeout(strategy: Any) -> Any:
    """The ``timedelta`` a Lightning DDP/model-parallel strategy's process group was built with (``_timeout``)."""
    return getattr(strategy, "_timeout", None)


def mark_scheduler_steps(optimizer: Any, step: Any) -> Any:
    """``step`` wrapped as an ``LRScheduler`` wraps its optimizer's (``optimizer``: a weak reference to call)."""
    if hasattr(step, "_wrapped_by_lr_sched"):
        return step
    from functools import wraps

    @wraps(step)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        optimizer()._opt_called = True
        return step(*args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    return tracked


def chained_schedulers(scheduler: Any) -> list[Any]:
    """The schedulers a SequentialLR or ChainedScheduler runs (its ``_schedulers``), ``[]`` for others."""
    return list(getattr(scheduler, "_schedulers", []))
