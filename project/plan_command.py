"""``python -m project plan``: what ``fit`` would resolve, printed; no training, no write, no ``prepare_data``."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import IterableDataset

from project.callbacks.model_checks import refuse_manual_accumulation
from project.errors import first_line
from project.layers import hooks
from project.parallel.limits import (
    SETTINGS,
    Limit,
    evaluation_limit,
    refuse_unreachable_validation,
    stream_limit,
    training_limit,
)
from project.parallel.sampler_install import takes_eval_sampler
from project.plan.environment import detect_environment
from project.plan.layout import LaunchMismatchError
from project.plan.resolve import Plan

if TYPE_CHECKING:
    from project.build import ProjectCLI


def training_loader(datamodule: Any) -> tuple[Any, str | None]:
    """The training loader from ``setup("fit")`` alone, which writes nothing, never ``prepare_data``; else why not."""
    if datamodule is None:
        return None, None
    try:
        datamodule.setup("fit")
        return datamodule.train_dataloader(), None
    except Exception as error:  # e.g. the files prepare_data would download: not there, and plan fetches nothing
        return None, (
            f"the training loader was not built ({type(datamodule).__name__}.setup needs what prepare_data provides, "
            f"which plan never runs: {first_line(error)})"
        )


def configured_batch_size(datamodule: Any) -> int | None:
    """The datamodule's ``batch_size`` as the config set it (an attribute or a saved hyperparameter), if any."""
    value = getattr(datamodule, "batch_size", None) or getattr(datamodule, "hparams", {}).get("batch_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def resolve_for_plan(cli: ProjectCLI, loader: Any, unbuilt: str | None) -> Plan:
    """The plan ``fit`` would resolve (without the loader, ``unbuilt`` says why); a launcher's refusal is a note."""
    environment = detect_environment()
    data_batch = getattr(loader, "batch_size", None) if loader is not None else configured_batch_size(cli.datamodule)
    notes: tuple[str, ...] = ()
    if unbuilt is not None:
        known = f"the config's batch_size {data_batch}" if data_batch is not None else "no batch size (fit reads it)"
        notes = (f"{unbuilt}: planned with {known}; the limits in samples are not counted",)
    try:
        plan = cli.state.resolve(environment, data_batch)
    except LaunchMismatchError as error:
        unset = replace(environment, world_size=None, local_world_size=None, num_nodes=None)
        plan = cli.state.resolve(unset, data_batch)
        notes = (*notes, f"will not start under {environment.launcher}: {error}")
    return replace(plan, notes=(*plan.notes, *notes)) if notes else plan


def trainer_limits(trainer: Any) -> SimpleNamespace:
    """The config's ``limit_*_batches`` and validation schedule as the Trainer reads them (``fast_dev_run`` too)."""
    fast = trainer.get("fast_dev_run")
    limits = {setting: trainer.get(setting) for setting in SETTINGS.values()}
    # Lightning's defaults (None: all batches); fast_dev_run N sets every limit to N and validates each epoch.
    limits = {key: int(fast) if fast else (1.0 if value is None else value) for key, value in limits.items()}
    interval = 1.0 if fast or trainer.get("val_check_interval") is None else trainer.get("val_check_interval")
    every = trainer.get("check_val_every_n_epoch")
    return SimpleNamespace(**limits, val_check_interval=interval, check_val_every_n_epoch=every)


EVAL_STAGES = {"validation": ("val_dataloader", "validate"), "test": ("test_dataloader", "test")}
EVAL_STAGES["predict"] = ("predict_dataloader", "predict")


def plan_limits(cli: ProjectCLI, plan: Plan, loader: Any) -> dict[str, list[Limit | str]]:
    """What each ``limit_*_batches`` keeps, in samples; refuses, as ``fit`` would, a validation it could never reach."""
    data, per_device = cli.datamodule, plan.per_device_batch_size
    if data is None or per_device is None or loader is None:
        return {}
    settings, micro = trainer_limits(cli.config.trainer), per_device * plan.dp_size
    found: dict[str, list[Limit | str]] = {}
    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        found["training"] = [stream_limit(settings.limit_train_batches, micro)]
    elif takes_eval_sampler(loader):  # the layer's training sampler goes where its evaluation sampler goes
        global_batches = len(loader.dataset) // (micro * plan.accumulation) * plan.accumulation
        if global_batches > 0:  # fewer samples than a global batch: fit refuses that itself
            refuse_unreachable_validation(settings, global_batches)
            found["training"] = [training_limit(settings.limit_train_batches, global_batches, micro)]
    for stage, (hook, setup) in EVAL_STAGES.items():
        if not is_overridden(hook, data):
            continue
        setting, limits = SETTINGS[stage], []
        try:
            data.setup(setup)
            loaders = _listed(getattr(data, hook)())
        except Exception as error:  # a loader that needs what only its own command provides must not stop the plan
            found[stage] = [f"{setting}: not counted, the {stage} loader could not be built here ({error})"]
            continue
        for one in loaders:
            if not takes_eval_sampler(one):
                limits.append(f"{setting} counts each process's own batches: the layer's sampler does not apply")
                continue
            value = getattr(settings, setting)
            limits.append(evaluation_limit(setting, value, len(one.dataset), one.batch_size, plan.dp_size))
        found[stage] = limits
    return found


def limits_json(limits: dict[str, list[Limit | str]]) -> dict[str, Any]:
    """``plan --json``'s ``limits``: per stage one limit (or a list, for several loaders), as plan.json records it."""
    items = {stage: [x.to_dict() if isinstance(x, Limit) else {"note": x} for x in f] for stage, f in limits.items()}
    return {stage: found[0] if len(found) == 1 else found for stage, found in items.items()}


def _listed(loaders: Any) -> list[Any]:
    """One loader, or the loaders of a list/tuple/dict (several validation sets)."""
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def print_plan(cli: ProjectCLI) -> None:
    """Print the plan as a table, or as one JSON object with ``--json``."""
    loader, unbuilt = training_loader(cli.datamodule)
    plan = resolve_for_plan(cli, loader, unbuilt)
    # What fit would refuse before starting, plan refuses alike (the plan of a run that cannot start misleads).
    refuse_manual_accumulation(cli.model, plan.accumulation, cli.state.section, plan)
    data, limits = plan.to_dict(), plan_limits(cli, plan, loader)
    data["limits"] = limits_json(limits)
    if cli.config.get("parallel") is None:
        data["notes"] = [*data["notes"], "no parallel section: this is what `parallel.scenario: auto` would do"]
    # Each layer's parts: JSON fields and printed tables (sharding: its units, styles, stages, memory table).
    reports = [report(cli, plan, data) for report in hooks("plan_report")]
    extra = {key: value for more, _ in reports for key, value in more.items()}
    shown = [table for _, tables in reports for table in tables]
    if cli.config.get("json"):
        sys.stdout.write(json.dumps({**data, **extra}) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="parallel plan", show_header=False)
    for key, value in data.items():
        if key == "limits":  # one line per limit, in samples
            value = "\n".join(
                f"{stage}: {x.describe() if isinstance(x, Limit) else x}" for stage, f in limits.items() for x in f
            )
        table.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
    console = Console()
    for printed in (table, *shown):
        console.print(printed)
