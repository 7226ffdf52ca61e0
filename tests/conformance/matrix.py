"""The conformance matrix: Lightning's documented features x the template's layouts x three checks.

Each :class:`Feature` is a plain-Lightning user module / datamodule / callback (``shapes_models.py``,
``shapes_data.py``) or a Trainer option, as users write them. Each runs on every layout of :data:`LAYOUTS`; each
(feature, layout) cell is checked three ways (:data:`CHECKS`), unless the feature or the layout says why a check
does not apply (:func:`not_applicable`). ``docs/conformance.md`` is generated from this table and the lane's results.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from helpers import CONFIGS, REPO, has_layer

BASE = str(REPO / "tests" / "conformance" / "base.yaml")
PACKAGE = "conformance."

# The layouts: the 1-process run is the reference of check (a); kill+resume (b) runs on the 2-process DDP layout.
ALL_LAYOUTS: dict[str, tuple[str, ...]] = {
    "1 process": (),
    "ddp, 2 processes": ("--config", str(CONFIGS / "parallel" / "cpu_ddp.yaml")),
    "fsdp, 2 processes": ("--config", str(CONFIGS / "sharding" / "cpu_fsdp.yaml")),
    "zero1, 2 processes": ("--config", str(CONFIGS / "sharding" / "zero1.yaml")),
}
#: The layer a layout's scenario belongs to (the others are the core's): its column runs where the layer is installed.
LAYOUT_LAYERS = {"fsdp, 2 processes": "sharding", "zero1, 2 processes": "sharding"}
#: The layouts the lane runs: the core's, and those of the installed layers.
LAYOUTS = {
    name: args for name, args in ALL_LAYOUTS.items() if name not in LAYOUT_LAYERS or has_layer(LAYOUT_LAYERS[name])
}
REFERENCE, RESUME_LAYOUT = "1 process", "ddp, 2 processes"
CHECKS = {
    "weights": "(a) 1 vs 2 processes, same global batch: the same final weights (last.ckpt, within 1e-5), and "
    "last.ckpt holds the step training ended at",
    "resume": "(b) SIGKILL of rank 1 mid-epoch, then `--resume auto`: the uninterrupted run's last.ckpt (within 1e-6)",
    "resume_epoch_end": "(b') the same, rank 1 killed right after the first epoch-end save (step 7, before step 8): "
    "resumed from the position every epoch scheduler, plateau, early stop and SWA acted at (features where they do)",
    "eval_once": "(c) every evaluation (validation; test and predict where the feature runs them) sees each sample "
    "exactly once over the ranks, the same evaluations as on 1 process, and a whole-set metric the 1-process value",
}


def callback(class_path: str, **init_args: object) -> str:
    """``--trainer.callbacks+=`` for a callback given by class path."""
    return "--trainer.callbacks+=" + json.dumps({"class_path": class_path, "init_args": init_args})


@dataclass(frozen=True)
class Feature:
    """One documented Lightning feature as a user plugs it in.

    Args:
        name: Its row in docs/conformance.md.
        what: The Lightning feature, in a few words.
        model / data: ``module.Class`` in tests/conformance (shapes_models, shapes_steps / shapes_data).
        options: Trainer / callback options after the layout.
        kill_step: The global step rank 1 is killed before in check (b) (a checkpoint every 3 steps: mid-epoch).
        keys: Checkpoint entries besides the weights that (a) and (b) compare (the user's own state).
        skip: Check -> why it does not apply to this feature.
        refusal_is_a_bug: Lightning documents it as working: a refusal fails the cell (issue 34's known breakages).
        predict: ``predict --ckpt_path last`` after the fit, on the same layout; check (c) covers its predictions.
        refused_at_step: Why the feature can only be refused at the step that uses it (it depends on the data): on
            several processes the cell is refused when the run ends with one ``error:`` line and no traceback,
            keeping what it wrote (a run that trained is never undone).
        needs: Layout -> the layer that makes the feature work there; without the layer its cells do not run.
        evaluated: The samples each validation sees (the first ones, in order), when the feature limits them.
    """

    name: str
    what: str
    model: str = "shapes_models.PointsRegressor"
    data: str = "shapes_data.PointsData"
    options: tuple[str, ...] = ()
    kill_step: int = 10
    keys: tuple[str, ...] = ()
    skip: dict[str, str] = field(default_factory=dict)
    refusal_is_a_bug: bool = False
    predict: bool = False
    refused_at_step: str = ""
    needs: dict[str, str] = field(default_factory=dict)
    evaluated: int | None = None

    def args(self) -> list[str]:
        """The feature's part of the command line (after the base config and the layout)."""
        return ["--model", PACKAGE + self.model, "--data", PACKAGE + self.data, *self.options]


CLIP, VAL_EVERY = "--trainer.gradient_clip_val", "--trainer.val_check_interval"
TIME_SKIP = "where a time limit stops depends on the machine's speed: not reproducible across runs"
FEATURES: tuple[Feature, ...] = (
    Feature("plain module", "a LightningModule and LightningDataModule with nothing else"),
    Feature("configure_model", "the network built in `configure_model`", model="shapes_models.ConfigureModel"),
    Feature(
        "on_save/load_checkpoint",
        "the module's own state in the checkpoint",
        model="shapes_models.CheckpointHooks",
        keys=("user_batches_trained",),
    ),
    Feature(
        "manual optimization",
        "`automatic_optimization = False`, two optimizers",
        model="shapes_models.ManualTwoOptimizers",
    ),
    Feature("LR scheduler by step", "`StepLR` with `interval: step`", model="shapes_models.StepLRByStep"),
    Feature("LR scheduler by epoch", "`StepLR` (interval epoch)", model="shapes_models.StepLRByEpoch"),
    Feature("ReduceLROnPlateau", "`ReduceLROnPlateau` monitoring `val/loss`", model="shapes_models.Plateau"),
    Feature("gradient clipping by norm", f"`{CLIP} 0.05`", options=(CLIP, "0.05")),
    Feature(
        "gradient clipping by value",
        f"`{CLIP} 0.01 --trainer.gradient_clip_algorithm value`",
        options=(CLIP, "0.01", "--trainer.gradient_clip_algorithm", "value"),
    ),
    Feature(
        "accumulate_grad_batches",
        "`--trainer.accumulate_grad_batches 2` (global batch 16 = 8 x 2 on 1 process)",
        options=("--trainer.accumulate_grad_batches", "2"),
    ),
    Feature(
        "EarlyStopping",
        "`EarlyStopping(monitor=val/loss)` that stops after epoch 2 of 4",
        options=(
            "--trainer.max_epochs",
            "4",
            callback("lightning.pytorch.callbacks.EarlyStopping", monitor="val/loss", patience=0, min_delta=10.0),
        ),
    ),
    Feature(
        "BackboneFinetuning",
        "`BackboneFinetuning(unfreeze_backbone_at_epoch=1)`",
        model="shapes_models.Finetuned",
        options=(callback("lightning.pytorch.callbacks.BackboneFinetuning", unfreeze_backbone_at_epoch=1),),
        # DDP (zero1's too) reduces only what trained when it was built: the guards layer rebuilds it at the unfreezing.
        needs={"ddp, 2 processes": "guards", "zero1, 2 processes": "guards"},
    ),
    Feature(
        "StochasticWeightAveraging",
        "`StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)`",
        options=(callback("lightning.pytorch.callbacks.StochasticWeightAveraging", swa_lrs=0.01, swa_epoch_start=1),),
    ),
    Feature(
        "own ModelCheckpoint",
        "`ModelCheckpoint(monitor=val/loss, save_top_k=2, save_last=True)` of the user's",
        options=(
            callback("lightning.pytorch.callbacks.ModelCheckpoint", monitor="val/loss", save_top_k=2, save_last=True),
        ),
    ),
    Feature(
        "several val/test/predict loaders",
        "two validation, test and predict loaders (`dataloader_idx`), tested after fit, then `predict`",
        data="shapes_data.SeveralEvalLoaders",
        options=("--test_after_fit", "true"),
        predict=True,
    ),
    Feature(
        "monitor with dataloader_idx",
        "`ModelCheckpoint(monitor=val/loss/dataloader_idx_0)` over two validation loaders",
        data="shapes_data.SeveralEvalLoaders",
        options=(callback("lightning.pytorch.callbacks.ModelCheckpoint", monitor="val/loss/dataloader_idx_0"),),
        refusal_is_a_bug=True,
    ),
    Feature(
        "CombinedLoader",
        "a `CombinedLoader` of two training loaders",
        model="shapes_models.CombinedBatches",
        data="shapes_data.CombinedTraining",
    ),
    Feature("IterableDataset", "an `IterableDataset` training loader", data="shapes_data.StreamedTraining"),
    Feature("own sampler", "a training `DataLoader(sampler=...)` of the user's", data="shapes_data.OwnSampler"),
    Feature(
        "own batch_sampler", "a length-bucketing `batch_sampler` of the user's", data="shapes_data.OwnBatchSampler"
    ),
    Feature(
        "datamodule state_dict",
        "a datamodule with `state_dict`/`load_state_dict`",
        data="shapes_data.StatefulData",
        keys=("StatefulData",),
    ),
    Feature(
        "torchmetrics", "a `MeanSquaredError` metric object logged with `sync_dist=True`", model="shapes_steps.Metrics"
    ),
    Feature(
        "self.all_gather", "the whole validation set's error from `self.all_gather`", model="shapes_steps.Gathered"
    ),
    Feature(
        "configure_callbacks",
        "ModelCheckpoint, LearningRateMonitor, EarlyStopping from the module",
        model="shapes_steps.OwnCallbacks",
    ),
    Feature(
        "training_step returns None",
        "the third batch of each epoch skipped",
        model="shapes_steps.SkipsSteps",
        refused_at_step="Lightning refuses a skipped step on several processes when one happens (data-dependent)",
    ),
    Feature(
        "on_train_batch_start returns -1",
        "the first epoch ended at its fifth batch",
        model="shapes_steps.EndsEpochEarly",
        kill_step=8,
    ),
    Feature("trainer.should_stop", "the module stops training after step 11", model="shapes_steps.StopsItself"),
    Feature("max_steps", "`--trainer.max_steps 11` (not an epoch end)", options=("--trainer.max_steps", "11")),
    Feature(
        "max_time",
        "`--trainer.max_time 00:00:00:02` before max_epochs 1000",
        options=("--trainer.max_time", "00:00:00:02", "--trainer.max_epochs", "1000"),
        skip={"weights": TIME_SKIP, "resume": TIME_SKIP},
    ),
    Feature(
        "limit_train_batches",
        "`--trainer.limit_train_batches 4`",
        options=("--trainer.limit_train_batches", "4"),
        kill_step=7,
    ),
    # Issue 46: the third round's shapes.
    Feature(
        "overfit_batches",
        "`--trainer.overfit_batches 2` over 4 epochs (2 batches of training and of validation, in order)",
        options=("--trainer.overfit_batches", "2", "--trainer.max_epochs", "4"),
        kill_step=7,
        evaluated=16,
    ),
    Feature("tied weights", "two layers sharing one weight", model="shapes_steps.TiedWeights"),
    Feature(
        "rank-local buffer",
        "a running input mean each rank keeps itself (`broadcast_buffers: false`)",
        model="shapes_steps.RunningNormaliser",
        skip={"weights": "a rank's own statistic follows its own samples: it depends on the world size by design"},
    ),
    Feature(
        "LearningRateFinder",
        "`LearningRateFinder(num_training_steps=5)` before training (within the first epoch)",
        options=(callback("lightning.pytorch.callbacks.LearningRateFinder", num_training_steps=5),),
    ),
    Feature(
        "GradientAccumulationScheduler",
        "`GradientAccumulationScheduler(scheduling={0: 1, 1: 2})`",
        options=(callback("lightning.pytorch.callbacks.GradientAccumulationScheduler", scheduling={"0": 1, "1": 2}),),
        kill_step=8,
    ),
    Feature(
        "monitor typo, no sanity check",
        "`ModelCheckpoint(monitor=val/typo)` with `--trainer.num_sanity_val_steps 0`",
        options=(
            "--trainer.num_sanity_val_steps",
            "0",
            callback("lightning.pytorch.callbacks.ModelCheckpoint", monitor="val/typo"),
        ),
        refused_at_step="without a sanity check the monitor is proven at the first validation (the state saved first)",
    ),
    Feature("val_check_interval fraction", "`--trainer.val_check_interval 0.5`", options=(VAL_EVERY, "0.5")),
    Feature(
        "check_val_every_n_epoch",
        "`--trainer.check_val_every_n_epoch 2` over 4 epochs",
        options=("--trainer.check_val_every_n_epoch", "2", "--trainer.max_epochs", "4"),
    ),
    Feature(
        "reload_dataloaders_every_n_epochs",
        "`--trainer.reload_dataloaders_every_n_epochs 1`",
        options=("--trainer.reload_dataloaders_every_n_epochs", "1"),
    ),
)
BY_NAME = {feature.name: feature for feature in FEATURES}


def not_applicable(feature: Feature, layout: str, check: str) -> str | None:
    """Why ``check`` does not apply to ``feature`` on ``layout``, or None when it does."""
    if check in feature.skip:
        return feature.skip[check]
    layer = feature.needs.get(layout)
    if layer is not None and not has_layer(layer):
        return f"the {layer} layer, which makes it work on this layout, is not installed"
    if check == "weights" and layout == REFERENCE:
        return "the reference the 2-process layouts are compared with"
    if check in ("resume", "resume_epoch_end") and layout != RESUME_LAYOUT:
        return "kill + resume runs on the 2-process DDP layout (one per feature: the lane's time)"
    if check == "resume_epoch_end" and feature.name not in EPOCH_END_FEATURES:
        return "nothing of the feature acts at an epoch end: the mid-epoch resume (b) covers it"
    if check == "resume_epoch_end" and "resume" in feature.skip:
        return feature.skip["resume"]
    return None


#: The features whose state changes at an epoch end (schedulers, plateau, early stopping, SWA, accumulation, a user's
#: own last.ckpt): their resume is also checked from the first epoch-end save.
EPOCH_END_FEATURES = frozenset(
    {
        "plain module",
        "LR scheduler by epoch",
        "ReduceLROnPlateau",
        "EarlyStopping",
        "StochasticWeightAveraging",
        "own ModelCheckpoint",
        "GradientAccumulationScheduler",
        "rank-local buffer",
        "check_val_every_n_epoch",
    }
)


def cells() -> list[tuple[str, str, str]]:
    """Every (feature, layout, check) that the lane runs."""
    return [
        (feature.name, layout, check)
        for feature in FEATURES
        for layout in LAYOUTS
        for check in CHECKS
        if not_applicable(feature, layout, check) is None
    ]
