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
from project.parallel.fsdp.units import plan_units
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
from project.plan.memory import estimate
from project.plan.optimizer_count import tensor_bytes
from project.plan.pipeline_plan import describe_stages
from project.plan.resolve import Plan
from project.plan.tensor_plan import resolve_tensor_plan, split_parameter_names

if TYPE_CHECKING:
    from project.build import ProjectCLI


def training_loader(datamodule: Any) -> tuple[Any, str | None]:
    """The training loader from ``setup("fit")`` alone, never ``prepare_data`` (downloads, files); else why not."""
    # setup writes nothing by Lightning's rules (it runs on every process); prepare_data is where files are written.
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
    """The plan ``fit`` would resolve; without the loader (``unbuilt``: why) from the config's batch size, said so."""
    # A layout an outside launcher would refuse is shown with the reason.
    environment = detect_environment()
    data_batch = getattr(loader, "batch_size", None) if loader is not None else configured_batch_size(cli.datamodule)
    notes: tuple[str, ...] = ()
    if unbuilt is not None:
        known = f"the config's batch_size {data_batch}" if data_batch is not None else "no batch size (fit reads it)"
        notes = (f"{unbuilt}: planned with {known}; the limits in samples are not counted",)
    try:
        plan = cli.state.resolve(environment, data_batch, cli.configured_lr())
    except LaunchMismatchError as error:
        unset = replace(environment, world_size=None, local_world_size=None, num_nodes=None)
        plan = cli.state.resolve(unset, data_batch, cli.configured_lr())
        notes = (*notes, f"will not start under {environment.launcher}: {error}")
    return replace(plan, notes=(*plan.notes, *notes)) if notes else plan


def trainer_limits(trainer: Any) -> SimpleNamespace:
    """The config's ``limit_*_batches`` and validation schedule as the Trainer reads them (``fast_dev_run`` too)."""
    fast = trainer.get("fast_dev_run")
    limits = {setting: trainer.get(setting) for setting in SETTINGS.values()}
    # Lightning's defaults (None: all batches); fast_dev_run N sets every limit to N and validates each epoch.
    limits = {key: int(fast) if fast else (1.0 if value is None else value) for key, value in limits.items()}
    interval = 1.0 if fast or trainer.get("val_check_interval") is None else trainer.get("val_check_interval")
    return SimpleNamespace(
        **limits, val_check_interval=interval, check_val_every_n_epoch=trainer.get("check_val_every_n_epoch")
    )


EVAL_STAGES = {"validation": ("val_dataloader", "validate"), "test": ("test_dataloader", "test")}
EVAL_STAGES["predict"] = ("predict_dataloader", "predict")


def plan_limits(cli: ProjectCLI, plan: Plan, loader: Any) -> dict[str, list[Limit | str]]:
    """What each ``limit_*_batches`` keeps under ``plan``, in samples, for the loaders the datamodule has.

    ``loader`` is the training loader (``None``: not built, nothing counted). Refuses, as ``fit`` would before
    training, a ``val_check_interval`` that validation could never reach.
    """
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
    items = {
        stage: [x.to_dict() if isinstance(x, Limit) else {"note": x} for x in found] for stage, found in limits.items()
    }
    return {stage: found[0] if len(found) == 1 else found for stage, found in items.items()}


def _listed(loaders: Any) -> list[Any]:
    """One loader, or the loaders of a list/tuple/dict (several validation sets)."""
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def memory_estimate(cli: ProjectCLI, plan: Plan) -> dict[str, Any] | None:
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
        tensor_split=tensor_split_bytes(cli.model, tensor_styles(cli, plan)),
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


def print_plan(cli: ProjectCLI) -> None:
    """Print the plan as a table, or as one JSON object with ``--json``."""
    loader, unbuilt = training_loader(cli.datamodule)
    plan = resolve_for_plan(cli, loader, unbuilt)
    # What fit would refuse before starting, plan refuses alike (the plan of a run that cannot start misleads).
    refuse_manual_accumulation(cli.model, plan.accumulation, cli.state.section, plan)
    data = plan.to_dict()
    data["strategy"].update(plan_units(plan, cli.model, cli.state.section.fsdp.wrap_modules))
    styles = tensor_styles(cli, plan)
    if styles:
        data["strategy"]["tensor_parallel"] = {"size": plan.layout.tp, "modules": styles}
    limits = plan_limits(cli, plan, loader)
    data["limits"] = limits_json(limits)
    if cli.config.get("parallel") is None:
        data["notes"] = [*data["notes"], "no parallel section: this is what `parallel.scenario: auto` would do"]
    memory = memory_estimate(cli, plan)
    if plan.layout.pp > 1 and cli.model is not None:  # each stage's units, parameters and state
        data["strategy"]["pipeline"] = describe_stages(cli.model, plan.layout.pp, plan.strategy_args, memory)
    if cli.config.get("json"):
        sys.stdout.write(json.dumps({**data, "memory": memory}) + "\n")
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
    console.print(table)
    if memory is not None:
        console.print(memory_table(memory))


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
