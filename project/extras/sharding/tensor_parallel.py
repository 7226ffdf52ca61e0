"""Tensor parallelism applied to any LightningModule from the plan (``parallel.tensor_parallel``), inside a rank.

The styles come from :func:`project.extras.sharding.plan.tensor_plan.resolve_tensor_plan` (pure, checked before
the first step); here they become ``torch.distributed.tensor.parallel`` styles on the tensor-parallel dimension of
the strategy's device mesh. A module that brings a ``parallelize(mesh)`` method is handed the mesh instead. Under
``scenario: fsdp`` the strategy then applies ``fully_shard`` per unit and to the root over the data-parallel
dimension (2-D; ``fully_shard`` on the root alone after TP fails on mixed meshes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from torch import nn

from project.extras.sharding.plan.tensor_plan import HOOK

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def apply_tensor_parallel(module: nn.Module, mesh: DeviceMesh, styles: Mapping[str, str]) -> None:
    """Split ``module``'s submodules in place as ``styles`` says (module name -> colwise | rowwise, or a hook)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    hooks = [name for name, style in styles.items() if style == HOOK]
    for name in hooks:
        module.get_submodule(name).parallelize(mesh)
    kinds = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {name: kinds[style]() for name, style in styles.items() if style != HOOK}
    if plan:
        parallelize_module(module, mesh, plan)
