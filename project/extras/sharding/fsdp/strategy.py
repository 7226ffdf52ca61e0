"""Fully sharded data parallel for any LightningModule: ``parallel.scenario: fsdp`` (the strategy).

The strategy is Lightning's FSDP2-based :class:`~lightning.pytorch.strategies.ModelParallelStrategy` (its device
mesh, launcher, process group), except that the module need not write ``configure_model``: the strategy applies
``torch.distributed.fsdp.fully_shard`` itself, from the plan, and points the optimizers LightningCLI built
before sharding at the sharded parameters. Its checkpoints are atomic sharded folders read under the project's
pickle policy (:mod:`project.extras.sharding.checkpoints`), written in the background unless
``parallel.fsdp.async_save`` is false (:mod:`project.extras.sharding.checkpoints.asynchronous`); every rank starts
from rank 0's weights, as under DDP;
gradient accumulation reduces on the last micro-batch only; an evaluation whose exactly-once shards give the
ranks different numbers of batches runs on parameters gathered once (FSDP's per-forward gathers would hang).
What is sharded, and which modules are units, is :mod:`project.extras.sharding.fsdp.units`; applying it,
:mod:`project.extras.sharding.fsdp.sharding`; the evaluation on uneven shards,
:mod:`project.extras.sharding.fsdp.evaluation`; saving and loading, :mod:`project.extras.sharding.fsdp.checkpoints`.

Sharding, in the words of FSDP1 / DeepSpeed:

- ``full`` (FULL_SHARD, ZeRO-3): parameters, gradients and optimizer state sharded; parameters are freed
  again after each unit's forward (``reshard_after_forward=True``).
- ``grad_op`` (SHARD_GRAD_OP, ZeRO-2): gradients and optimizer state sharded; gathered parameters stay
  from forward to backward (``reshard_after_forward=False``): less communication, more memory.
- ``hybrid`` (HYBRID_SHARD): full sharding within a node, replicas across nodes (a 2-D mesh
  ``(num_nodes, processes per node)``): the all-gathers stay on the fast intra-node links.

It runs on GPUs (nccl) and, where no GPU is visible, on CPU processes over gloo (how it is tested here).
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from lightning.pytorch.strategies import ModelParallelStrategy, Strategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from project.extras.sharding.checkpoints.asynchronous import AsyncShardedWriter
from project.extras.sharding.fsdp.checkpoints import ShardedCheckpoints
from project.extras.sharding.fsdp.evaluation import evaluation_batches, gather_if_uneven, reshard_after_evaluation
from project.extras.sharding.fsdp.sharding import (
    broadcast_from_rank0,
    fsdp_modules,
    is_sharded,
    point_optimizers_at,
    shard_module,
)
from project.extras.sharding.fsdp.units import resolve_wrap_classes
from project.extras.sharding.lightning_private import strategy_timeout
from project.extras.sharding.plan.tensor_plan import resolve_tensor_plan
from project.extras.sharding.tensor_parallel import apply_tensor_parallel
from project.plan.layout import Layout

#: The mesh hybrid sharding shards over: the layout's replicas (across nodes) x shards (within a node).
HYBRID_DIMS = ("dp_replicate", "dp_shard")

if TYPE_CHECKING:
    import lightning as L
    from torch.distributed.device_mesh import DeviceMesh


class FullyShardStrategy(ShardedCheckpoints, ModelParallelStrategy):
    """FSDP2 over every process (or hybrid: sharded within a node, replicated across nodes), for any module.

    Args:
        layout: The plan's layout: its data-parallel degree (replicas x shards) and tensor-parallel degree go to
            Lightning's mesh (through its constructor), its replicas and shards to the mesh hybrid sharding uses.
        sharding: full | grad_op | hybrid (see the module docstring).
        cpu_offload: Keep sharded parameters, gradients and optimizer state in host memory (GPUs).
        wrap_modules: Class names or import paths of the modules that become units; ``None``: the default rule.
        process_group_backend: nccl | gloo; ``None``: Lightning's default for the device.
        timeout: How long a collective may wait.
        tensor_plan: ``parallel.tensor_parallel.plan`` (``auto`` or module patterns -> styles), for ``tp > 1``.
        async_save: Write checkpoints in the background (a save costs the training a copy of its shards), at most
            one in flight; false: every rank waits for the write.
    """

    def __init__(
        self,
        layout: Layout,
        sharding: str = "full",
        cpu_offload: bool = False,
        wrap_modules: list[str] | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
        tensor_plan: str | dict[str, str] = "auto",
        async_save: bool = False,
    ) -> None:
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        super().__init__(
            data_parallel_size=layout.dp_size,
            tensor_parallel_size=layout.tp,
            save_distributed_checkpoint=True,
            process_group_backend=process_group_backend,
            **kwargs,
        )
        self.sharding = sharding
        self.cpu_offload = cpu_offload
        self.wrap_modules = wrap_modules
        self.layout = layout
        self.tensor_plan = tensor_plan
        self.async_save = async_save
        self._writer = AsyncShardedWriter()
        #: What the tensor plan split (module name -> style), once applied: plan.json records it.
        self.tensor_styles: dict[str, str] = {}
        self._shard_mesh: DeviceMesh | None = None
        self._gathered_for_evaluation: list[Any] = []
        self._before_sharding: dict[str, nn.Parameter] = {}

    def connect(self, model: L.LightningModule) -> None:
        """Check, before anything runs, that the module's networks can be sharded (and split) as asked."""
        resolve_wrap_classes(model, self.wrap_modules)
        if self.layout.tp > 1:
            resolve_tensor_plan(model, self.tensor_plan, self.layout.tp)
        super().connect(model)

    def setup_environment(self) -> None:
        """Lightning's mesh of the layout's degrees (data parallel x tensor parallel); hybrid: the layout's own."""
        super().setup_environment()
        if self.sharding == "hybrid":  # the layout's replicas x shards, both kept (HSDP takes a 2-D mesh)
            from torch.distributed.device_mesh import init_device_mesh

            shape = tuple(self.layout.size(dim) for dim in HYBRID_DIMS)
            self._shard_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=HYBRID_DIMS)
        else:
            self._shard_mesh = self.device_mesh["data_parallel"]

    def setup(self, trainer: L.Trainer) -> None:
        """Shard the module (unless its ``configure_model`` did), then Lightning's usual setup."""
        assert self.lightning_module is not None and self._shard_mesh is not None
        module = self.lightning_module
        # The parameters before sharding, kept alive (so their ids stay theirs) until the optimizers are built.
        self._before_sharding = dict(module.named_parameters())
        if not is_sharded(module):
            # float64 (precision 64) before the split: Lightning's setup converts the module after it, too late
            self.precision_plugin.convert_module(module)
            broadcast_from_rank0(module, self.root_device)
            tp = self.layout.tp
            if tp > 1:  # split the layers first; fully_shard then shards the split parameters (2-D)
                self.tensor_styles = resolve_tensor_plan(module, self.tensor_plan, tp)
                apply_tensor_parallel(module, self.device_mesh["tensor_parallel"], self.tensor_styles)
            if tp == 1 or self.layout.dp_size > 1:
                classes = resolve_wrap_classes(module, self.wrap_modules)
                shard_module(module, self._shard_mesh, self.sharding, self.cpu_offload, classes)
        # Lightning's ModelParallelStrategy.setup insists on a configure_model that shards; the plain
        # Strategy.setup does the rest (precision, device, optimizers over the sharded parameters).
        Strategy.setup(self, trainer)
        self._before_sharding = {}
        if self.async_save and trainer.state.fn == TrainerFn.FITTING:
            self._writer.setup(strategy_timeout(self))  # every rank: the background writes' own gloo group
        self.barrier()

    def setup_optimizers(self, trainer: L.Trainer) -> None:
        """Lightning's optimizers, pointed at the sharded parameters.

        LightningCLI builds the config's ``optimizer:`` when it builds the model, over the parameters as they
        were before sharding; ``fully_shard`` replaced them (by name) with sharded ones.
        """
        super().setup_optimizers(trainer)
        assert self.lightning_module is not None
        now = dict(self.lightning_module.named_parameters())
        point_optimizers_at(self.optimizers, self._before_sharding, now)

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Accumulate gradients locally on the micro-batches before the last (DDP's ``no_sync``)."""
        units = fsdp_modules(self.model) if self.model is not None else []
        for unit in units:
            unit.set_requires_gradient_sync(False, recurse=False)
        try:
            yield None
        finally:
            for unit in units:
                unit.set_requires_gradient_sync(True, recurse=False)

    # Evaluation on shards of uneven length: parameters gathered once (project.extras.sharding.fsdp.evaluation).

    def _gather_if_uneven(self) -> None:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or self.world_size == 1:
            return
        mine = evaluation_batches(trainer)  # one count per loader; every rank has the same loaders
        units = gather_if_uneven(self.lightning_module, mine, self.world_size, self.root_device)
        if units is not None:
            self._gathered_for_evaluation = units

    def _reshard_after_evaluation(self) -> None:
        reshard_after_evaluation(self._gathered_for_evaluation, self.lightning_module, self.sharding)
        self._gathered_for_evaluation = []

    def on_validation_start(self) -> None:
        """Gather the parameters for this evaluation if the ranks' batch counts differ."""
        self._gather_if_uneven()

    def on_validation_end(self) -> None:
        """Free the gathered parameters."""
        self._reshard_after_evaluation()

    on_test_start = on_validation_start
    on_test_end = on_validation_end
    on_predict_start = on_validation_start
    on_predict_end = on_validation_end


def build(args: dict[str, Any], backend: str | None, layout: Layout) -> FullyShardStrategy:
    """The row's builder: :class:`FullyShardStrategy` with the plan's arguments and the layout's degrees."""
    return FullyShardStrategy(
        layout,
        sharding=args["fsdp"]["sharding"],
        cpu_offload=args["fsdp"]["cpu_offload"],
        wrap_modules=args["fsdp"]["wrap_modules"],
        process_group_backend=backend,
        timeout=timedelta(seconds=args["timeout_s"]),
        tensor_plan=args.get("tensor_parallel_plan", "auto"),
        async_save=args["fsdp"]["async_save"],
    )


def build_tensor_parallel(args: dict[str, Any], backend: str | None, layout: Layout) -> FullyShardStrategy:
    """The ``tensor_parallel`` row's builder: the same strategy, every process one tensor-parallel group."""
    return FullyShardStrategy(
        layout,
        process_group_backend=backend,
        timeout=timedelta(seconds=args["timeout_s"]),
        tensor_plan=args["tensor_parallel_plan"],
        async_save=args["fsdp"]["async_save"],
    )
