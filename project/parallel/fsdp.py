"""Fully sharded data parallel for any LightningModule: ``parallel.scenario: fsdp``.

The strategy is Lightning's FSDP2-based :class:`~lightning.pytorch.strategies.ModelParallelStrategy` (its device
mesh, launcher, process group), except that the module need not write ``configure_model``: the strategy applies
``torch.distributed.fsdp.fully_shard`` itself, from the plan, and points the optimizers LightningCLI built
before sharding at the sharded parameters. Its checkpoints are atomic sharded folders read under the project's
pickle policy (:mod:`project.checkpoints.sharded`); every rank starts from rank 0's weights, as under DDP;
gradient accumulation reduces on the last micro-batch only; an evaluation whose exactly-once shards give the
ranks different numbers of batches runs on parameters gathered once (FSDP's per-forward gathers would hang).

What is sharded: every child module of the LightningModule that holds parameters (the networks it calls,
e.g. ``.net``) is one FSDP root, and inside it each module of ``wrap_modules`` is a unit of its own (its
parameters are gathered just before its forward and freed after). Without ``wrap_modules`` the units are
the outermost modules whose class occurs more than once in the network (an MLP's layers, a transformer's
blocks): :func:`default_wrap_classes`. Parameters held by the LightningModule itself would not be
sharded nor reduced, so they are refused.

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

import uuid
from collections import Counter
from collections.abc import Generator, Iterable
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy, Strategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from project.checkpoints.sharded import is_sharded_checkpoint, load_full_into, load_sharded_into, save_sharded
from project.dotted import names_object
from project.errors import UserError
from project.lightning_private import set_mesh_sizes
from project.plan.strategies import RESHARD_AFTER_FORWARD

if TYPE_CHECKING:
    import lightning as L
    from torch.distributed.device_mesh import DeviceMesh


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def sharded_roots(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The children of a LightningModule that FSDP shards (those with parameters: its networks).

    Raises:
        UserError: the LightningModule holds parameters itself, which FSDP would neither shard nor reduce.
    """
    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise UserError(
            f"scenario fsdp shards the networks a LightningModule holds, but {type(module).__name__} holds the "
            f"parameter(s) {', '.join(own)} itself; move them into a child nn.Module, or use scenario ddp"
        )
    return [(name, child) for name, child in module.named_children() if _has_parameters(child)]


def _class_names(cls: type) -> set[str]:
    return {cls.__name__, f"{cls.__module__}.{cls.__qualname__}"}


def default_wrap_classes(roots: Iterable[nn.Module]) -> list[type]:
    """The outermost repeated modules' classes: an MLP's layers, a transformer's blocks (not the layers inside).

    A class qualifies when more than one of its modules (with parameters) is in the networks and a walk from
    each network's top meets it before any other repeated class; a class whose modules also sit inside another
    qualifying class's modules is dropped (a transformer's blocks, not also every Linear in and around them).
    """
    roots = list(roots)
    counts: Counter[type] = Counter()
    for root in roots:
        counts.update(type(m) for m in root.modules() if m is not root and _has_parameters(m))
    found: list[type] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if counts[type(child)] > 1 and _has_parameters(child):
                if type(child) not in found:
                    found.append(type(child))
            else:
                visit(child)

    for root in roots:
        visit(root)
    nested = {
        type(inner)
        for root in roots
        for outer in root.modules()
        if outer is not root and type(outer) in found
        for inner in outer.modules()
        if inner is not outer and type(inner) in found and type(inner) is not type(outer)
    }
    return [cls for cls in found if cls not in nested]


def resolve_wrap_classes(module: nn.Module, wrap_modules: list[str] | None) -> list[type]:
    """The module classes that become FSDP units: ``wrap_modules`` (names or import paths) or the default rule.

    Raises:
        UserError: a name matches no module class of the model (the message lists the classes it has).
    """
    roots = [child for _, child in sharded_roots(module)]
    if wrap_modules is None:
        return default_wrap_classes(roots)
    present = {type(m) for root in roots for m in root.modules() if _has_parameters(m)}
    chosen: list[type] = []
    for name in wrap_modules:
        found = [cls for cls in present if name in _class_names(cls)]
        if not found and "." in name:
            found = [cls for cls in present if names_object(name, cls)]
        if not found:
            have = ", ".join(sorted(cls.__name__ for cls in present)) or "none"
            raise UserError(
                f"parallel.wrap_modules lists {name!r}, but {type(module).__name__}'s networks have no module of "
                f"that class (they have: {have}); name one of those, or leave wrap_modules unset for the default"
            )
        chosen += [cls for cls in found if cls not in chosen]
    return chosen


def describe_wrapping(module: nn.Module, wrap_modules: list[str] | None) -> dict[str, Any]:
    """What ``fully_shard`` makes units of: the networks (roots), the unit classes, how many units (for ``plan``)."""
    classes = resolve_wrap_classes(module, wrap_modules)
    roots = sharded_roots(module)
    units = sum(1 for _, root in roots for m in root.modules() if m is not root and isinstance(m, tuple(classes)))
    return {
        "roots": [name for name, _ in roots],
        "classes": [cls.__name__ for cls in classes],
        "units": units,
    }


def plan_units(scenario: str, strategy: str, model: nn.Module | None, wrap_modules: list[str] | None) -> dict[str, Any]:
    """``plan``'s view of the units: ``{"units": describe_wrapping(...)}`` under the fsdp strategy, else ``{}``.

    Under scenario fsdp it checks ``wrap_modules`` against the model at any world size (one line if wrong).
    """
    if scenario != "fsdp" or model is None:
        return {}
    units = describe_wrapping(model, wrap_modules)
    return {"units": units} if strategy == "fsdp" else {}


def is_sharded(module: nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``module`` or one of its submodules."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def fsdp_modules(module: nn.Module) -> list[Any]:
    """The FSDP units inside ``module``."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def shard_module(
    module: nn.Module,
    mesh: DeviceMesh,
    sharding: str,
    cpu_offload: bool,
    wrap_classes: list[type],
) -> None:
    """Apply ``fully_shard`` to each unit of ``module``'s networks (innermost first), then to each network."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": RESHARD_AFTER_FORWARD[sharding],
        # Pinned host memory needs CUDA; on CPU processes the offload is a no-op anyway.
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy(),
    }
    classes = tuple(wrap_classes)
    for _, root in sharded_roots(module):
        # Reversed pre-order puts every module after its descendants: fully_shard goes bottom-up.
        for sub in reversed(list(root.modules())):
            if sub is not root and isinstance(sub, classes) and _has_parameters(sub):
                fully_shard(sub, **kwargs)
        fully_shard(root, **kwargs)


def broadcast_from_rank0(module: nn.Module, device: torch.device) -> None:
    """Give every rank rank 0's parameters and buffers before sharding, as DDP does when it wraps.

    A tensor that is not on the process group's ``device`` (CPU weights under nccl) goes through a copy there,
    one tensor at a time, so no rank ever holds the whole model on the device.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.device.type == "meta":
                continue
            if tensor.device == device:
                dist.broadcast(tensor, src=0)
            else:
                staged = tensor.detach().to(device)
                dist.broadcast(staged, src=0)
                tensor.copy_(staged)


def sharded_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether sharded (FSDP) tensors (gradients, parameters) are finite on every rank.

    Each rank holds its shard, so a nan may sit in one rank's shard only: each rank checks its own and the
    verdicts are all-reduced (one one-element collective), so all ranks agree.
    """
    from torch.distributed.tensor import DTensor

    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    norm = torch.nn.utils.get_total_norm(local, norm_type=2.0, foreach=True)
    bad = (~torch.isfinite(norm)).float().reshape(1)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bool(bad.item())


class FullyShardStrategy(ModelParallelStrategy):
    """FSDP2 over every process (or hybrid: sharded within a node, replicated across nodes), for any module.

    Args:
        sharding: full | grad_op | hybrid (see the module docstring).
        cpu_offload: Keep sharded parameters, gradients and optimizer state in host memory (GPUs).
        wrap_modules: Class names or import paths of the modules that become units; ``None``: the default rule.
        process_group_backend: nccl | gloo; ``None``: Lightning's default for the device.
        timeout: How long a collective may wait.
        data_parallel: The layout's data-parallel degree (replicas x shards); ``None``: every process.
        tensor_parallel: The layout's tensor-parallel degree (1: none).
    """

    def __init__(
        self,
        sharding: str = "full",
        cpu_offload: bool = False,
        wrap_modules: list[str] | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
        data_parallel: int | None = None,
        tensor_parallel: int = 1,
    ) -> None:
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        super().__init__(save_distributed_checkpoint=True, process_group_backend=process_group_backend, **kwargs)
        self.sharding = sharding
        self.cpu_offload = cpu_offload
        self.wrap_modules = wrap_modules
        self.degrees = (data_parallel, tensor_parallel)
        self._shard_mesh: DeviceMesh | None = None
        self._gathered_for_evaluation: list[Any] = []
        self._before_sharding: dict[str, nn.Parameter] = {}

    def connect(self, model: L.LightningModule) -> None:
        """Check, before anything runs, that the module's networks can be sharded as asked."""
        resolve_wrap_classes(model, self.wrap_modules)
        super().connect(model)

    def setup_environment(self) -> None:
        """The mesh of the layout's degrees (data parallel x tensor parallel); hybrid adds a 2-D data mesh."""
        data_parallel, tensor_parallel = self.degrees
        set_mesh_sizes(self, data_parallel or self.num_nodes * self.num_processes, tensor_parallel)
        super().setup_environment()
        if self.sharding == "hybrid":
            from torch.distributed.device_mesh import init_device_mesh

            self._shard_mesh = init_device_mesh(
                self.root_device.type,
                (self.num_nodes, self.num_processes),
                mesh_dim_names=("dp_replicate", "dp_shard"),
            )
        else:
            self._shard_mesh = self.device_mesh["data_parallel"]

    def setup(self, trainer: L.Trainer) -> None:
        """Shard the module (unless its ``configure_model`` did), then Lightning's usual setup."""
        assert self.lightning_module is not None and self._shard_mesh is not None
        module = self.lightning_module
        # The parameters before sharding, kept alive (so their ids stay theirs) until the optimizers are built.
        self._before_sharding = dict(module.named_parameters())
        if not is_sharded(module):
            broadcast_from_rank0(module, self.root_device)
            classes = resolve_wrap_classes(module, self.wrap_modules)
            shard_module(module, self._shard_mesh, self.sharding, self.cpu_offload, classes)
        # Lightning's ModelParallelStrategy.setup insists on a configure_model that shards; the plain
        # Strategy.setup does the rest (precision, device, optimizers over the sharded parameters).
        Strategy.setup(self, trainer)
        self._before_sharding = {}
        self.barrier()

    def setup_optimizers(self, trainer: L.Trainer) -> None:
        """Lightning's optimizers, pointed at the sharded parameters.

        LightningCLI builds the config's ``optimizer:`` when it builds the model, over the parameters as they
        were before sharding; ``fully_shard`` replaced them (by name) with sharded ones.
        """
        super().setup_optimizers(trainer)
        assert self.lightning_module is not None
        now = dict(self.lightning_module.named_parameters())
        live = {id(p) for p in now.values()}
        names = {id(p): name for name, p in self._before_sharding.items()}
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                for i, param in enumerate(group["params"]):
                    if id(param) not in live and id(param) in names:
                        group["params"][i] = now[names[id(param)]]
                        if param in optimizer.state:
                            optimizer.state[group["params"][i]] = optimizer.state.pop(param)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Every rank writes its shards into a hidden folder; rank 0 moves it onto the name when complete."""
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options (got {storage_options!r})")
        path = Path(self.broadcast(str(filepath)))
        token = self.broadcast(uuid.uuid4().hex[:12])
        path.parent.mkdir(parents=True, exist_ok=True)
        save_sharded(checkpoint, path, token, self.is_global_zero, self.barrier)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """A sharded checkpoint, resharded onto this world size, or a plain file, sharded here (both read safely).

        The optimizer state is read for ``fit`` only: the test of the best checkpoint after a fit, in the same
        process, has the fit's optimizers still, and needs none of their state (as Lightning's FSDP strategy).
        """
        path = Path(self.broadcast(str(checkpoint_path)))
        assert self.model is not None and self.lightning_module is not None
        fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        optimizers = self.optimizers if fitting else []
        strict = self.lightning_module.strict_loading
        if is_sharded_checkpoint(path):
            return load_sharded_into(path, self.model, optimizers, strict=strict)
        # A file (DDP's, one process's, consolidate's): the CLI's read of it, not Lightning's second one.
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        load_full_into(path, checkpoint, self.model, optimizers, strict=strict)
        return checkpoint

    def teardown(self) -> None:
        """Lightning's teardown, plus the checkpoint IO's (ModelParallelStrategy skips it): queued removals finish."""
        super().teardown()
        self.checkpoint_io.teardown()

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

    # Evaluation: FSDP gathers each unit's parameters at every forward, a collective that every rank must
    # join; exactly-once shards can give ranks different numbers of batches. Then the parameters are gathered
    # once for the whole evaluation (the full model's memory, as under DDP) and freed after.

    def _evaluation_batches(self, trainer: L.Trainer) -> list[float]:
        if trainer.testing:
            return list(trainer.num_test_batches)
        if trainer.predicting:
            return list(trainer.num_predict_batches)
        if trainer.sanity_checking:
            return list(trainer.num_sanity_val_batches)
        return list(trainer.num_val_batches)

    def _gather_if_uneven(self) -> None:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or self.world_size == 1:
            return
        mine = self._evaluation_batches(trainer)  # one count per loader; every rank has the same loaders
        counts = torch.tensor([float(n) for n in mine], dtype=torch.float64, device=self.root_device)
        everyone = [torch.zeros_like(counts) for _ in range(self.world_size)]
        dist.all_gather(everyone, counts)
        if all(torch.equal(c, everyone[0]) for c in everyone) and torch.isfinite(counts).all():
            return
        units = fsdp_modules(self.lightning_module)
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        self._gathered_for_evaluation = units

    def _reshard_after_evaluation(self) -> None:
        roots = {id(child) for child in self.lightning_module.children()} if self.lightning_module else set()
        for unit in self._gathered_for_evaluation:
            unit.reshard()
            # FSDP2's own choice back: a root keeps its parameters from forward to backward (they would be
            # gathered again at once), the other units as the sharding says.
            again = RESHARD_AFTER_FORWARD[self.sharding] and id(unit) not in roots
            unit.set_reshard_after_forward(again, recurse=False)
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


def build(args: dict[str, Any], backend: str | None, degrees: dict[str, int]) -> FullyShardStrategy:
    """The row's builder: :class:`FullyShardStrategy` with the plan's arguments and the layout's degrees."""
    return FullyShardStrategy(
        sharding=args["sharding"],
        cpu_offload=args["cpu_offload"],
        wrap_modules=args["wrap_modules"],
        process_group_backend=backend,
        timeout=timedelta(seconds=args["timeout_s"]),
        data_parallel=degrees["dp_replicate"] * degrees["dp_shard"],
        tensor_parallel=degrees.get("tp", 1),
    )
