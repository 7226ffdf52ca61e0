"""Per-device memory of parameters, gradients and optimizer state under ddp and fsdp, counted from the built model.

``plan`` shows it so that a user sees, before any GPU is touched, when a full replica per device (DDP) will not
fit and how far sharding (FSDP) brings it down:

- parameters and buffers: every tensor of the built model, by its own ``numel`` and dtype;
- gradients: one per trainable parameter, of the parameter's dtype;
- optimizer state: counted by running one step of the configured optimizer (its class and arguments) over
  meta-device copies of the trainable parameters, which allocates nothing; when that cannot run (an optimizer
  that needs a closure, or a custom one that does not work on meta tensors) Adam's two states per parameter are
  assumed, and the estimate says so;
- ddp (and every scenario that replicates: cpu, single, dp, fork) holds all of it on every device; fsdp divides
  parameters, gradients and optimizer state by the shard degree (``full``: the world size; ``grad_op``: gradients
  and optimizer state only; ``hybrid``: the processes of one node), buffers are not sharded; ``cpu_offload``
  moves the sharded parameters, gradients and optimizer state to host memory.

Mixed precision (``bf16-mixed``, ``16-mixed``) keeps float32 parameters (the master weights), gradients and
optimizer state: the estimate is the same as for ``32``. Not counted: activations, which grow with the per-device
batch and usually dominate; autocast's half-precision copies; FSDP's gathered unit; communication buckets; the
CUDA context and the allocator's cache.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from torch import nn

from project.extras.sharding.plan.optimizer_count import OptimizerCount, count_optimizer, tensor_bytes
from project.plan.layout import Layout

NOT_COUNTED = (
    "activations (they grow with the per-device batch and often dominate), autocast's half-precision copies, "
    "FSDP's gathered unit, communication buckets, the CUDA context and the allocator's cache"
)
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human(size: int) -> str:
    """``size`` bytes in binary units, three significant digits (``1.5 GiB``)."""
    value, unit = float(size), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    if unit == 0:
        return f"{size} B"
    # Three significant digits, but never in exponent notation (1012 KiB, not 1.01e+03 KiB).
    return f"{value:.0f} {_UNITS[unit]}" if value >= 100 else f"{value:.3g} {_UNITS[unit]}"


@dataclass(frozen=True)
class ModelCount:
    """The built model's tensors: elements and bytes of its parameters (all, trainable) and buffers."""

    name: str
    parameters: int
    trainable: int
    parameter_bytes: int
    trainable_bytes: int
    buffer_bytes: int
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, model: nn.Module) -> ModelCount:
        """Count ``model``'s parameters (each shared one once) and buffers."""
        params = list(model.parameters())  # nn.Module.parameters() yields a shared parameter once
        trainable = [p for p in params if p.requires_grad]
        return cls(
            name=type(model).__name__,
            parameters=sum(p.numel() for p in params),
            trainable=sum(p.numel() for p in trainable),
            parameter_bytes=tensor_bytes(params),
            trainable_bytes=tensor_bytes(trainable),
            buffer_bytes=tensor_bytes(model.buffers()),
            dtypes=tuple(sorted({str(p.dtype).removeprefix("torch.") for p in params})),
        )

    def to_dict(self) -> dict[str, Any]:
        """What ``plan`` shows of the model."""
        keys = ("name", "parameters", "trainable", "parameter_bytes", "buffer_bytes")
        return {**{key: getattr(self, key) for key in keys}, "dtypes": list(self.dtypes)}


#: What each way of sharding divides by its shard degree: zero1 the optimizer state, fsdp by its ``sharding``.
DIVIDES: dict[str, tuple[str, ...]] = {
    "zero1": ("optimizer_state",),
    "grad_op": ("gradients", "optimizer_state"),
    "full": ("parameters", "gradients", "optimizer_state"),
    "hybrid": ("parameters", "gradients", "optimizer_state"),
}
#: The ways whose sharded state ``cpu_offload`` keeps in host memory (fsdp's).
OFFLOADED = ("grad_op", "full", "hybrid")


def _entry(size: int) -> dict[str, Any]:
    return {"bytes": size, "human": human(size)}


def per_device(
    count: ModelCount,
    optimizer: OptimizerCount,
    shard: int,
    sharding: str | None,
    cpu_offload: bool = False,
) -> dict[str, Any]:
    """Bytes one device holds: everything replicated (``sharding`` None: ddp) or divided ``shard`` ways.

    ``zero1`` divides the optimizer state, fsdp's ``grad_op`` also the gradients, ``full``/``hybrid`` also the
    parameters.
    """
    divided = DIVIDES[sharding] if sharding is not None else ()
    sizes = {"parameters": count.parameter_bytes, "gradients": count.trainable_bytes}
    sizes["optimizer_state"] = optimizer.state_bytes
    params, grads, states = (math.ceil(size / shard) if kind in divided else size for kind, size in sizes.items())
    row: dict[str, Any] = {"shard_degree": shard if sharding is not None else 1}
    if sharding is not None:
        row["sharding"] = sharding
    if cpu_offload and sharding in OFFLOADED:
        row["offloaded_to_host"] = _entry(params + grads + states)
        params = grads = states = 0
    row.update(
        parameters=_entry(params),
        gradients=_entry(grads),
        optimizer_state=_entry(states),
        buffers=_entry(count.buffer_bytes),
        total=_entry(params + grads + states + count.buffer_bytes),
    )
    return row


def as_trained(
    count: ModelCount, optimizer: OptimizerCount, precision: str, split: tuple[int, int], tp: int
) -> tuple[ModelCount, OptimizerCount]:
    """The counts as one device holds them.

    Doubled under ``precision: 64`` (the model is built in float32), and the ``split`` bytes (all, trainable) of
    the tensor-parallel layers divided by ``tp``.
    """
    scale = 2 if precision == "64" else 1
    params = scale * (count.parameter_bytes - split[0] + math.ceil(split[0] / tp))
    trainable = scale * (count.trainable_bytes - split[1] + math.ceil(split[1] / tp))
    # The optimizer's state follows the trainable parameters it is kept for.
    states = round(optimizer.state_bytes * trainable / (scale * count.trainable_bytes)) if count.trainable_bytes else 0
    count = replace(count, parameter_bytes=params, trainable_bytes=trainable, buffer_bytes=scale * count.buffer_bytes)
    return count, replace(optimizer, state_bytes=scale * states)


def shard_degree(sharding: str, dp_size: int, per_node: int) -> int:
    """How many ways fsdp divides the state: every data-parallel rank, or one node's for ``hybrid``."""
    return per_node if sharding == "hybrid" else dp_size


def estimate(
    model: nn.Module,
    optimizer_section: Mapping[str, Any] | None,
    *,
    planned: str,
    layout: Layout,
    sharding: str,
    cpu_offload: bool,
    precision: str,
    tensor_split: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """The ``memory`` block of ``plan``: the model's counts and the per-device bytes under ddp, zero1 and fsdp.

    Args:
        model: The built LightningModule (or any module).
        optimizer_section: The config's ``optimizer:`` section (``class_path``/``init_args``), if any.
        planned: ``ddp``, ``zero1`` or ``fsdp``: which of them the plan runs (its strategy row's ``memory``).
        layout: The plan's layout: the state is divided over its data-parallel ranks, never over the world size
            (``hybrid`` shards within a node).
        sharding: fsdp's ``full``, ``grad_op`` or ``hybrid``.
        cpu_offload: fsdp keeps the sharded state in host memory.
        precision: The plan's precision (mixed precision keeps float32 state: said, not counted twice; 64
            doubles every byte).
        tensor_split: Bytes of the parameters (all, trainable) the tensor-parallel plan splits ``tp`` ways.
    """
    tp, dp_size = layout.tp, layout.dp_size
    count, optimizer = as_trained(
        ModelCount.of(model), count_optimizer(model, optimizer_section), precision, tensor_split, tp
    )
    # What fsdp shards over on this layout (the plan's own dp_shard when it runs fsdp: the same number).
    fsdp_shard = shard_degree(sharding, dp_size, layout.per_node // tp)
    mixed = f"; {precision} keeps float32 parameters, gradients and optimizer state" if "mixed" in precision else ""
    mixed += f"; tensor parallel {tp} divides the split layers first" if tp > 1 else ""
    mixed += "; float64 (precision 64)" if precision == "64" else ""
    return {
        "planned": planned,
        "model": count.to_dict(),
        "optimizer": asdict(optimizer),
        "per_device": {
            "ddp": per_device(count, optimizer, 1, None),
            "zero1": per_device(count, optimizer, dp_size, "zero1"),
            "fsdp": per_device(count, optimizer, fsdp_shard, sharding, cpu_offload=cpu_offload),
        },
        "note": f"Persistent state per device{mixed}. Not counted: {NOT_COUNTED}",
    }
