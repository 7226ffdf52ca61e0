"""The layer's part of ``python -m project plan``: FSDP's units, tensor styles, pipeline stages, the memory table.

The memory table shows per device what ddp replicates, what zero1 shards (the optimizer state) and what fsdp
shards (all of it), side by side.

Called by :func:`project.plan_command.print_plan` (the layer's ``plan_report`` hook) once the plan is resolved;
a plan that cannot apply to the built model (a tensor-parallel pattern matching nothing, a stage split past the
blocks) refuses here, as ``fit`` would before training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from project.extras.sharding.fsdp.units import plan_units
from project.extras.sharding.plan.memory import estimate
from project.extras.sharding.plan.optimizer_count import tensor_bytes
from project.extras.sharding.plan.pipeline_plan import describe_stages
from project.extras.sharding.plan.tensor_plan import resolve_tensor_plan, split_parameter_names

if TYPE_CHECKING:
    from project.build import ProjectCLI
    from project.plan.resolve import Plan


def report(cli: ProjectCLI, plan: Plan, data: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The ``plan_report`` hook: ``data``'s ``strategy`` completed; ``{"memory": ...}`` and the memory table."""
    section = cli.state.section
    assert section is not None
    data["strategy"].update(plan_units(plan, cli.model, section.fsdp.wrap_modules))
    styles = tensor_styles(cli, plan)
    if styles:
        data["strategy"]["tensor_parallel"] = {"size": plan.layout.tp, "modules": styles}
    memory = memory_estimate(cli, plan, styles)
    if plan.layout.pp > 1 and cli.model is not None:  # each stage's units, parameters and state
        data["strategy"]["pipeline"] = describe_stages(cli.model, plan.layout.pp, plan.strategy_args, memory)
    return {"memory": memory}, ([memory_table(memory)] if memory is not None else [])


def memory_estimate(cli: ProjectCLI, plan: Plan, styles: dict[str, str]) -> dict[str, Any] | None:
    """Per-device memory of the built model under this plan's layout, ddp beside fsdp (``None``: no model)."""
    if cli.model is None:
        return None
    settings = cli.state.section
    assert settings is not None
    section = cli.config.get("optimizer")
    return estimate(
        cli.model,
        section.as_dict() if hasattr(section, "as_dict") else section,
        planned=plan.row.memory,
        layout=plan.layout,
        sharding=settings.fsdp.sharding,
        cpu_offload=settings.fsdp.cpu_offload,
        precision=plan.precision,
        tensor_split=tensor_split_bytes(cli.model, styles),
    )


def tensor_styles(cli: ProjectCLI, plan: Plan) -> dict[str, str]:
    """The tensor-parallel plan resolved on the built model (``{}`` without one); one that cannot apply refuses."""
    tp = plan.layout.tp
    if tp == 1 or cli.model is None:
        return {}
    assert cli.state.section is not None
    return resolve_tensor_plan(cli.model, cli.state.section.tensor_parallel.plan, tp)


def tensor_split_bytes(model: Any, styles: dict[str, str]) -> tuple[int, int]:
    """Bytes of the parameters (all, trainable) the resolved tensor-parallel plan splits."""
    names = split_parameter_names(model, styles)
    split = [p for name, p in model.named_parameters() if name in names]
    return tensor_bytes(split), tensor_bytes(p for p in split if p.requires_grad)


def memory_table(memory: dict[str, Any]) -> Any:
    """The ``memory`` block as a table: one row per kind of state, ddp, zero1 and fsdp side by side, planned marked."""
    from rich.table import Table

    model, optimizer, rows = memory["model"], memory["optimizer"], memory["per_device"]
    fsdp = rows["fsdp"]
    titles = {
        "ddp": "ddp",
        "zero1": f"zero1 / {rows['zero1']['shard_degree']}",
        "fsdp": f"fsdp {fsdp['sharding']} / {fsdp['shard_degree']}"
        + (", offloaded" if "offloaded_to_host" in fsdp else ""),
    }
    table = Table(
        title="memory per device (estimate): ddp replicates everything, zero1 shards the optimizer state, fsdp all",
        caption_justify="left",
        caption=f"{model['name']}: {model['parameters']:,} parameters ({model['trainable']:,} trainable, "
        f"{', '.join(model['dtypes'])}); optimizer {optimizer['class_path']}: {optimizer['states_per_parameter']:g} "
        f"state(s) per parameter, {optimizer['source']}. {memory['note']}",
    )
    table.add_column("")
    for kind, title in titles.items():
        table.add_column(title + (" (planned)" if memory["planned"] == kind else ""), justify="right")
    kinds = ["parameters", "gradients", "optimizer_state", "buffers", "total"]
    if "offloaded_to_host" in fsdp:
        kinds.append("offloaded_to_host")
    for kind in kinds:
        cells = [rows[way][kind]["human"] if kind in rows[way] else "-" for way in titles]
        table.add_row(kind.replace("_", " "), *cells)
    return table
