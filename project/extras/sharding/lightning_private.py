"""The sharding layer's private torch names, with the public API that is missing (see ``project.lightning_private``).

- ``torch.distributed.checkpoint``'s metadata globals, pickled in a sharded folder's ``.metadata``: the loading policy
  allows them (:data:`CHECKPOINT_PRIVATE_GLOBALS`).
- A sharded folder merged in one process: ``_load_state_dict`` with ``_EmptyStateDictLoadPlanner``, what the public
  ``dcp_to_torch_save`` uses, which reads without the template's pickle policy (:func:`load_without_process_group`,
  :data:`EMPTY_LOAD_PLANNER`).
- A Lightning strategy's process-group timeout, ``_timeout`` (:func:`strategy_timeout`).
- The marks an LR scheduler puts on the optimizer ZeRO-1 replaces, and SequentialLR's ``_schedulers``
  (:func:`mark_scheduler_steps`, :func:`chained_schedulers`).
"""

from __future__ import annotations

from functools import wraps
from typing import Any

_DCP = "torch.distributed.checkpoint"
#: (module, name) of torch.distributed.checkpoint's private globals pickled in a sharded folder's ``.metadata``.
CHECKPOINT_PRIVATE_GLOBALS = frozenset(
    {
        (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"),
        (f"{_DCP}.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
    }
)


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


def strategy_timeout(strategy: Any) -> Any:
    """The ``timedelta`` a Lightning DDP/model-parallel strategy's process group was built with (``_timeout``)."""
    return getattr(strategy, "_timeout", None)


def mark_scheduler_steps(optimizer: Any, step: Any) -> Any:
    """``step`` wrapped as an ``LRScheduler`` wraps its optimizer's (``optimizer``: a weak reference to call)."""
    if hasattr(step, "_wrapped_by_lr_sched"):
        return step

    @wraps(step)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        optimizer()._opt_called = True
        return step(*args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    return tracked


def chained_schedulers(scheduler: Any) -> list[Any]:
    """The schedulers a SequentialLR or ChainedScheduler runs (its ``_schedulers``), ``[]`` for others."""
    return list(getattr(scheduler, "_schedulers", []))
