"""A network's example inputs, recorded from its first forward call in training, for its torch.export program.

:class:`InputRecorder` keeps a few samples of that call's inputs (:class:`Example`, on the CPU, detached); at the
end of ``fit`` :func:`.export_program.export_program` captures the network on them, their batch
dimension dynamic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

#: Samples of the first training batch kept as example inputs: few (they live until the end of fit), and more
#: than 1, since torch.export specializes a dimension of size 0 or 1 instead of keeping it dynamic.
EXAMPLE_BATCH = 4


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``fn`` applied to every tensor in nested tuples, lists and dicts; other values as they are."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def leaves(value: Any) -> Iterator[Any]:
    """Every leaf of nested tuples, lists and dicts (tensors and other values), in order."""
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from leaves(v)
    else:
        yield value


@dataclass
class Example:
    """Example inputs of a network: positional and keyword arguments, on CPU, detached.

    ``batch``: the size of their batch dimension (dim 0 of every tensor whose dim 0 matched the first tensor's
    in the recorded call), or ``None`` when no tensor has one.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    batch: int | None = None

    @classmethod
    def of_call(cls, args: tuple[Any, ...], kwargs: dict[str, Any], keep: int = EXAMPLE_BATCH) -> Example:
        """The first ``keep`` samples of a call's inputs (copies, so the batch they came from is not held)."""
        first = next((t for t in leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim() > 0), None)
        size = None if first is None else first.shape[0]

        def small(t: torch.Tensor) -> torch.Tensor:
            t = t.detach()
            return (t[:keep] if t.dim() > 0 and t.shape[0] == size else t).to("cpu", copy=True)

        return cls(_map(tuple(args), small), _map(dict(kwargs), small), None if size is None else min(size, keep))

    def batched(self, value: Any) -> bool:
        """Whether ``value`` is one of the tensors with the batch dimension."""
        return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == self.batch

    def grown(self) -> Example:
        """The same inputs with one more sample (the first one again): a batch of another size."""
        return Example(
            _map(self.args, lambda t: torch.cat([t, t[:1]]) if self.batched(t) else t),
            _map(self.kwargs, lambda t: torch.cat([t, t[:1]]) if self.batched(t) else t),
            None if self.batch is None else self.batch + 1,
        )

    def describe(self) -> list[str]:
        """``args[0]: float32[batch, 64]``: each tensor input, its batch dimension named ``batch`` if dynamic."""
        dynamic = self.batch is not None and self.batch > 1
        out = []
        for where, value in (("args", self.args), ("kwargs", self.kwargs)):
            for key, leaf in _paths(value):
                if isinstance(leaf, torch.Tensor):
                    dims = [str(d) for d in leaf.shape]
                    if dynamic and self.batched(leaf):
                        dims[0] = "batch"
                    out.append(f"{where}{key}: {str(leaf.dtype).removeprefix('torch.')}[{', '.join(dims)}]")
        return out


def _paths(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _paths(v, f"{prefix}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, f"{prefix}[{k!r}]")
    else:
        yield prefix, value


class InputRecorder:
    """Record a network's example inputs from its next forward call, then unhook (a forward pre-hook)."""

    def __init__(self, net: nn.Module) -> None:
        self.example: Example | None = None
        # Called eagerly even inside a compiled network (a graph break once): the hook keeps Python state.
        self._handle = net.register_forward_pre_hook(torch.compiler.disable(self._record), with_kwargs=True)

    def _record(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.example is None:
            self.example = Example.of_call(args, kwargs)
        self.remove()

    def remove(self) -> None:
        """Unhook (idempotent); :attr:`example` stays."""
        self._handle.remove()
