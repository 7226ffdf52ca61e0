"""Every use of a private Lightning or torch name by the core, in one place, with the public API that is missing.

A layer keeps its own in ``project/extras/<layer>/lightning_private.py``. Importing this module imports nothing from
Lightning (``project.export`` uses it in plain processes); ``tests/unit/test_lightning_private.py`` fails loudly when
a Lightning upgrade moves any of these.

1. The processes Lightning's launcher started for ranks 1..N-1 (``_SubprocessScriptLauncher.procs``), with those
   rank 0 started itself (:mod:`project.launch.ranks`): to name the rank that died first and stop the others when
   rank 0 fails (Lightning kills them only on Ctrl+C).
2. Fabric's module wrapper (``_FabricModule``, holding the module at ``_forward_module``) and torch.compile's
   ``_orig_mod``, which ``project.export.unwrap`` sees through by name, so that it never imports Lightning.
3. Not a name but a behaviour: the Trainer calls a callback's hook only when ``callable(getattr(callback, hook))``;
   ``project.callbacks.dispatch.skip_idle_batch_hooks`` sets empty per-batch hooks to ``None`` (no public way).
4. The version a TensorBoard/CSV logger has not chosen yet (``_version is None``) and the next free one
   (``_get_next_version()``). Lightning picks the version by listing, so two runs started at once pick the same
   folder; :func:`project.runs.reserve_run_directory` creates it atomically and gives the logger that version.
5. A callback's state key, ``Callback._generate_state_key(**kwargs)``, as Lightning's ``ModelCheckpoint`` names its
   state in a checkpoint (:func:`state_key`).
6. Lightning's signal handlers and its per-step SIGTERM broadcast (``_broadcast_sigterm_tensor``: a collective and a
   host sync per step); the template agrees on a stop without them (:mod:`project.callbacks.preemption`).
7. What the sanity check logged per validation loader, ``trainer._results``: with several loaders
   ``callback_metrics`` holds none of them until the first real validation (:func:`logged_per_loader`).
8. The default process group's store, torch's ``_get_default_store`` (:func:`default_store`).
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


def default_store() -> Any:
    """The default process group's store (torch's ``_get_default_store``): the rendezvous every rank reaches."""
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()
