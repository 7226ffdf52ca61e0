"""``PipelineStrategy``: the network cut into stages, Lightning's training step a pipelining schedule.

Each stage runs on one rank of each pipeline; its replicas over its data-parallel group average their gradients
after the schedule (one all-reduce, as DDP's mean:
:func:`~project.extras.sharding.pipeline.schedule.average_gradients`).

Lightning's loop keeps its shape: ``training_step`` is the schedule (forward and backward of every micro-batch; the
module's own ``training_step`` is not called), ``backward`` does nothing (the schedule did it), the optimizer step,
schedulers, callbacks and checkpoints are Lightning's. Evaluation runs the module's own ``validation_step`` /
``test_step`` / ``predict_step`` with its network replaced, for the step, by a forward through the stages
(:class:`~project.extras.sharding.pipeline.schedule.PipelineForward`). The mesh is the layout's: pipeline stages
outermost, then data-parallel replicas (docs/extras/sharding.md, "Pipeline parallelism").
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from project.errors import UserError
from project.extras.sharding.fsdp.sharding import broadcast_from_rank0
from project.extras.sharding.pipeline.checkpoint import (
    gather_over,
    group_names,
    stage_optimizer_state,
    whole_optimizer_state,
    whole_state_dict,
)
from project.extras.sharding.pipeline.contract import check_contract, refuse_loop_features, split_batch
from project.extras.sharding.pipeline.schedule import (
    Pipeline,
    PipelineForward,
    average_gradients,
    make_schedule,
    train_step,
)
from project.extras.sharding.pipeline.split import cut_stage, keep_stage_parameters
from project.extras.sharding.plan.pipeline_plan import StagePlan, plan_stages
from project.plan.layout import Layout

if TYPE_CHECKING:
    import lightning as L


class PipelineStrategy(DDPStrategy):
    """Pipeline parallelism (x data parallelism) for a LightningModule that meets the pipeline contract.

    Args:
        layout: The run's layout (``pp`` stages x ``dp_replicate`` replicas).
        schedule: ``1f1b`` or ``gpipe``.
        microbatches: Micro-batches each rank's batch is cut into; ``None``: the stage count.
        split_points: The first unit of each stage after the first; ``None``: the module's or an even split.
        process_group_backend: nccl | gloo; ``None``: Lightning's default for the device.
        timeout: How long a collective may wait.
        start_method: Lightning's start method of the processes it launches.
    """

    def __init__(
        self,
        layout: Layout,
        schedule: str = "1f1b",
        microbatches: int | None = None,
        split_points: list[str] | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
        start_method: str = "popen",
    ) -> None:
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        super().__init__(process_group_backend=process_group_backend, start_method=start_method, **kwargs)
        self.layout = layout
        self.schedule = schedule
        self.microbatches = microbatches or layout.pp
        self.split_points = split_points
        #: The stages' units and parameter counts, once the module is connected (plan.json may record it).
        self.stages: list[StagePlan] = []
        self._network = "net"
        self._where: Pipeline | None = None
        self._dp_group: Any = None
        self._schedule: Any = None
        self._forward: PipelineForward | None = None
        self._whole_groups: list[list[list[str]]] = []
        self._whole_names: list[str] = []
        self._grads: list[tuple[Tensor, Tensor | None]] = []

    def connect(self, model: L.LightningModule) -> None:
        """Refuse, before anything runs, a module without the contract or a split that cannot be made."""
        self._network = check_contract(model, self.layout.pp)
        self.stages = plan_stages(model, self.layout.pp, self.split_points)
        super().connect(model)

    def setup_environment(self) -> None:
        """The process group, then every pipeline's group and every data-parallel group (all ranks make each)."""
        super().setup_environment()
        rank, layout = self.global_rank, self.layout
        if layout.world_size != self.world_size:
            raise UserError(f"the pipeline layout has {layout.world_size} processes but {self.world_size} started")
        for ranks in layout.group_ranks(("pp",)):
            group = dist.new_group(ranks)
            if rank in ranks:
                self._where = Pipeline(ranks.index(rank), layout.pp, group, ranks, self.root_device)
        for ranks in layout.group_ranks(("dp_replicate", "dp_shard")):
            group = dist.new_group(ranks)
            if rank in ranks:
                self._dp_group = group

    def setup(self, trainer: L.Trainer) -> None:
        """Cut this rank's stage from the whole module; for fit, its optimizers and schedule."""
        assert self.accelerator is not None and self.lightning_module is not None and self._where is not None
        self.accelerator.setup(trainer)
        module = self.lightning_module
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            refuse_loop_features(trainer, self.layout.pp)
        self.precision_plugin.convert_module(module)  # float64 (precision 64) before the cut
        self.model_to_device()
        broadcast_from_rank0(module, self.root_device)  # every stage starts from rank 0's whole model
        if fitting:  # the optimizers over the whole network first: one process's order of its parameters
            self.setup_optimizers(trainer)
            self._whole_groups = [group_names(optimizer, module) for optimizer in self.optimizers]
        self._whole_names = [name for name, _ in module.named_parameters()]
        net = getattr(module, self._network)
        cut_stage(net, self.stages, self._where.stage)
        if fitting:
            keep_stage_parameters(self.optimizers, module)
            self._schedule = make_schedule(net, self._where, self.schedule, self.microbatches, module.pipeline_loss)
        self._forward = PipelineForward(net, self._where)
        self.setup_precision_plugin()

    def training_step(self, *args: Any, **kwargs: Any) -> Tensor:
        """The schedule over the step's micro-batches; the mean loss of the batch, on every rank."""
        assert self._where is not None and self.lightning_module is not None
        x, y = split_batch(args[0], type(self.lightning_module).__name__)
        if x.shape[0] % self.microbatches:
            raise UserError(
                f"parallel.pipeline_parallel.microbatches={self.microbatches} does not divide the per-device batch "
                f"of {x.shape[0]} samples; choose a divisor of it or another parallel.per_device_batch_size"
            )
        parameters = list(self.lightning_module.parameters())
        for parameter in parameters:  # each step from no gradient (accumulation is refused): the schedule adds
            parameter.grad = None
        with self.precision_plugin.train_step_context():
            loss = train_step(self._schedule, self._where, x, y)
        average_gradients(parameters, self._dp_group, self.layout.dp_size)
        # Lightning's closure zeroes the gradients between the training step and the backward: keep them aside.
        self._grads = [(parameter, parameter.grad) for parameter in parameters]
        for parameter in parameters:
            parameter.grad = None
        return loss

    def backward(self, closure_loss: Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> Tensor:
        """The schedule's gradients given back: it ran every micro-batch's backward (and the replicas' all-reduce)."""
        for parameter, grad in self._grads:
            parameter.grad = grad
        self._grads = []
        return closure_loss

    @contextmanager
    def _through_stages(self) -> Generator[None, None, None]:
        """The module's network is the forward through the stages for the duration of one evaluation step."""
        module = self.lightning_module
        net = getattr(module, self._network)
        setattr(module, self._network, self._forward)
        try:
            yield
        finally:
            setattr(module, self._network, net)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's own step, its network the forward through the stages."""
        with self._through_stages():
            return super().validation_step(*args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's own step, its network the forward through the stages."""
        with self._through_stages():
            return super().test_step(*args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's own step, its network the forward through the stages."""
        with self._through_stages():
            return super().predict_step(*args, **kwargs)

    def whole_training_set(self, trainable: list[str]) -> tuple[list[str], list[list[list[str]]]]:
        """The whole model's trainable names and its optimizers' parameter groups by name, as one process's.

        ``trainable``: this stage's trainable names; the other stages' are gathered (a collective: every rank).
        """
        assert self._where is not None
        found = {name for part in gather_over(self._where, trainable) for name in part}
        return [name for name in self._whole_names if name in found], self._whole_groups

    @property
    def replica_group(self) -> Any:
        """The process group of this stage's data-parallel replicas (the replica guard compares them)."""
        return self._dp_group

    @property
    def whole_parameter_groups(self) -> list[list[list[str]]]:
        """The optimizers' parameter groups by name over the whole network, recorded before the cut."""
        return self._whole_groups

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The whole model's state dict (every stage's part), as one process's (:mod:`.checkpoint`)."""
        assert self.lightning_module is not None and self._where is not None
        return whole_state_dict(self.lightning_module, self._where)

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """The optimizer's state as one process's optimizer over the whole network holds it."""
        assert self.lightning_module is not None and self._where is not None
        optimizer = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer's optimizer
        whole = self._whole_groups[self.optimizers.index(optimizer)]
        return whole_optimizer_state(optimizer, self.lightning_module, whole, self._where)

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        """One process's optimizer states (from any layout's checkpoint), each cut to this stage."""
        assert self.lightning_module is not None
        for optimizer, saved, whole in zip(self.optimizers, checkpoint["optimizer_states"], self._whole_groups):
            optimizer.load_state_dict(stage_optimizer_state(saved, optimizer, self.lightning_module, whole))


def build(args: dict[str, Any], backend: str | None, layout: Layout) -> PipelineStrategy:
    """The ``pipeline`` row's builder: :class:`PipelineStrategy` with the plan's arguments and the layout."""
    return PipelineStrategy(
        layout,
        schedule=args["schedule"],
        microbatches=args["microbatches"],
        split_points=args["split_points"],
        process_group_backend=backend,
        timeout=timedelta(seconds=args["timeout_s"]),
        start_method=args.get("start_method", "popen"),
    )
