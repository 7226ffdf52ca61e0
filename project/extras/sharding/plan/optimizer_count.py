"""The optimizer state a model's optimizer keeps, counted by one step on meta-device copies (nothing allocated).

The optimizer is the config's ``optimizer:`` section (its class and arguments), else the one the module's own
``configure_optimizers`` builds; when a step cannot run on meta tensors (an optimizer that needs a closure, or a
custom one) Adam's two states per parameter are assumed, and the count says so.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from project.dotted import import_object

#: States per parameter assumed when the optimizer cannot be stepped on meta tensors (Adam/AdamW keep two).
ASSUMED_STATES = 2


@dataclass(frozen=True)
class OptimizerCount:
    """Bytes of optimizer state for the model's trainable parameters, and how that number was found."""

    class_path: str | None
    state_bytes: int
    states_per_parameter: float
    source: str


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes the tensors hold (elements x element size)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _import(class_path: str) -> type:
    return import_object(class_path)


def optimizer_of(model: nn.Module, section: Mapping[str, Any] | None) -> tuple[type | None, dict[str, Any]]:
    """The optimizer class and arguments: the config's ``optimizer:`` section, else ``configure_optimizers()``."""
    if section and section.get("class_path"):
        return _import(str(section["class_path"])), dict(section.get("init_args") or {})
    configure = getattr(model, "configure_optimizers", None)
    try:
        with warnings.catch_warnings():  # Lightning's base class warns that it is not implemented
            warnings.simplefilter("ignore")
            found = configure() if callable(configure) else None
    except Exception:  # a module whose configure_optimizers needs a Trainer: no optimizer to count
        return None, {}
    for item in _flatten(found):
        if isinstance(item, torch.optim.Optimizer):
            return type(item), _accepted(type(item), dict(item.defaults))
    return None, {}


def _accepted(cls: type, defaults: dict[str, Any]) -> dict[str, Any]:
    """The ``defaults`` an optimizer's constructor takes (AdamW keeps a derived ``decoupled_weight_decay``)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return defaults
    names = {p.name for p in parameters}
    return {key: value for key, value in defaults.items() if key in names}


def _flatten(value: Any) -> Iterable[Any]:
    if isinstance(value, Mapping):
        yield from _flatten(value.get("optimizer"))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    elif value is not None:
        yield value


def count_optimizer(model: nn.Module, section: Mapping[str, Any] | None) -> OptimizerCount:
    """Optimizer state of ``model``'s trainable parameters: one meta-device step of the configured optimizer."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    param_bytes = tensor_bytes(trainable)
    try:
        cls, kwargs = optimizer_of(model, section)
    except (ImportError, AttributeError, ValueError) as error:
        cls, kwargs, why = None, {}, f"the optimizer class does not import ({error})"
    else:
        why = "no optimizer in the config or configure_optimizers()"
    name = None if cls is None else f"{cls.__module__}.{cls.__qualname__}"
    if cls is not None:
        try:
            state_bytes = _step_on_meta(cls, kwargs, trainable)
        except Exception as error:  # any optimizer that cannot step on meta tensors falls back to the assumption
            why = f"one step on meta tensors failed: {type(error).__name__}: {str(error)[:120]}"
        else:
            per = state_bytes / param_bytes if param_bytes else 0.0
            return OptimizerCount(
                name, state_bytes, round(per, 3), f"counted: one step of {cls.__name__} on meta copies of the weights"
            )
    return OptimizerCount(
        name,
        ASSUMED_STATES * param_bytes,
        float(ASSUMED_STATES),
        f"assumed {ASSUMED_STATES} states per parameter, as Adam keeps ({why})",
    )


def _step_on_meta(cls: type, kwargs: dict[str, Any], params: list[nn.Parameter]) -> int:
    """Bytes of state ``cls(**kwargs)`` keeps after one step over meta copies of ``params`` (nothing allocated)."""
    if not params:
        return 0
    copies = []
    for param in params:
        copy = torch.empty_like(param, device="meta").requires_grad_()
        copy.grad = torch.empty_like(copy)
        copies.append(copy)
    optimizer = cls(copies, **kwargs)
    optimizer.step()
    total = 0
    for state in optimizer.state.values():
        total += tensor_bytes(v for v in state.values() if isinstance(v, torch.Tensor))
    return total
