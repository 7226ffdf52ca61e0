"""``python -m project plan``: the plan ``fit`` would resolve, printed, without training or writing anything."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from project.parallel.environment import detect_environment
from project.parallel.fsdp import plan_units
from project.parallel.layout import LaunchMismatchError
from project.parallel.plan import Plan, resolve_plan

if TYPE_CHECKING:
    from project.build import ProjectCLI


def training_batch_size(datamodule: Any) -> int | None:
    """The batch size of the training loader the datamodule returns (built here: ``plan`` trains nothing)."""
    if datamodule is None:
        return None
    datamodule.prepare_data()
    datamodule.setup("fit")
    return getattr(datamodule.train_dataloader(), "batch_size", None)


def resolve_for_plan(cli: ProjectCLI) -> Plan:
    """The plan ``fit`` would resolve; a layout an outside launcher would refuse is shown with the reason."""
    assert cli.plan_inputs is not None
    settings, hardware = cli.plan_inputs
    environment = detect_environment()
    data_batch = training_batch_size(cli.datamodule)
    try:
        return resolve_plan(settings, hardware, environment, data_batch, cli.configured_lr())
    except LaunchMismatchError as error:
        unset = replace(environment, world_size=None, local_world_size=None, num_nodes=None)
        plan = resolve_plan(settings, hardware, unset, data_batch, cli.configured_lr())
        return replace(plan, notes=(*plan.notes, f"will not start under {environment.launcher}: {error}"))


def print_plan(cli: ProjectCLI) -> None:
    """Print the plan as a table, or as one JSON object with ``--json``."""
    plan = resolve_for_plan(cli)
    data = plan.to_dict()
    data["strategy"].update(plan_units(plan.scenario, plan.strategy, cli.model, cli.plan_inputs[0].wrap_modules))
    if cli.config.get("parallel") is None:
        data["notes"] = [*data["notes"], "no parallel section: this is what `parallel.scenario: auto` would do"]
    if cli.config.get("json"):
        sys.stdout.write(json.dumps(data) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="parallel plan", show_header=False)
    for key, value in data.items():
        table.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
    Console().print(table)
