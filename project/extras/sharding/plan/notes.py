"""What the plan says about the ``parallel.fsdp`` subsection on a layout, and the layouts it refuses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from project.errors import UserError
from project.plan.scenarios import SCENARIOS

if TYPE_CHECKING:
    from project.plan.config import ParallelConfig
    from project.plan.layout import Layout


def sharding_notes(config: ParallelConfig, layout: Layout, strategy: str, start_method: str) -> list[str]:
    """The layer's ``plan_notes`` hook: the ``parallel.fsdp`` fields checked against the layout, and what they do.

    Raises:
        UserError: an fsdp field with another scenario, hybrid on one node, fsdp in a notebook.
    """
    fsdp = config.fsdp
    fields = {"sharding": "full", "cpu_offload": False, "wrap_modules": None}
    if SCENARIOS[layout.scenario].data_parallel != "shard":
        for name, default in fields.items():
            if getattr(fsdp, name) != default:
                raise UserError(
                    f"parallel.fsdp.{name}={getattr(fsdp, name)!r} applies to scenario fsdp only, and this plan's "
                    f"scenario is {layout.scenario!r}; drop it, or set parallel.scenario: fsdp"
                )
        return []
    if fsdp.sharding == "hybrid" and layout.num_nodes < 2:
        raise UserError(
            f"parallel.fsdp.sharding='hybrid' shards within a node and replicates across nodes, but num_nodes="
            f"{layout.num_nodes}; use sharding full (or grad_op) on one node, or set parallel.num_nodes > 1"
        )
    if layout.world_size == 1:
        return [
            "fsdp on one process: nothing to shard, it runs on a single device and writes plain checkpoint files "
            "(sharding, cpu_offload and wrap_modules apply from 2 processes); it resumes sharded checkpoints"
        ]
    if start_method == "fork":
        raise UserError(
            "scenario fsdp starts its processes by running the command again, which an interactive session "
            "cannot; run it from a terminal, or use scenario fork (DDP) here"
        )
    what = {
        "full": "parameters, gradients and optimizer state",
        "grad_op": "gradients and optimizer state (parameters stay gathered from forward to backward)",
        "hybrid": "parameters, gradients and optimizer state",
    }[fsdp.sharding]
    across = (
        f"within each node ({layout.dp_shard} processes), replicated across {layout.dp_replicate} nodes"
        if fsdp.sharding == "hybrid"
        else f"over all {layout.dp_shard} processes"
    )
    notes = [f"fsdp {fsdp.sharding}: {what} sharded {across}; checkpoints are sharded folders"]
    if layout.accelerator == "cpu":
        notes.append("fsdp on CPU processes over gloo (no GPU visible): the same FSDP2 code as on GPUs")
        if fsdp.cpu_offload:
            notes.append("cpu_offload on CPU processes changes nothing: the parameters are in host memory already")
    return notes
