"""One pipeline stage cut from the whole network, in place: the other stages' units become ``nn.Identity``.

Parameter names (FQNs) stay those of the whole model (torchtitan's way), so a stage's state dict is a subset of
one process's, and the optimizers keep only the stage's parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from project.errors import UserError
from project.extras.sharding.plan.pipeline_plan import StagePlan, pipeline_units, shared_across_stages


def cut_stage(net: nn.Module, plan: Sequence[StagePlan], index: int) -> None:
    """Replace every unit of ``net`` that stage ``index`` does not run with ``nn.Identity``.

    Raises:
        UserError: a parameter two stages would share (tied weights cannot live on two stages).
    """
    shared = shared_across_stages(net, plan)
    if shared is not None:
        raise UserError(
            f"parallel.pipeline_parallel: the parameter {shared!r} is shared by two stages (tied weights); "
            "untie it (e.g. tie_weights: false) or choose split_points that keep its users on one stage"
        )
    kept = set(plan[index].modules)
    for unit in pipeline_units(net):
        if unit not in kept:
            net.set_submodule(unit, nn.Identity())


def keep_stage_parameters(optimizers: Sequence[Any], module: nn.Module) -> None:
    """Drop from each optimizer's groups the parameters ``module`` no longer holds (other stages' units).

    The config's optimizer may have been built over the whole network before the cut; its state is still empty.
    """
    alive = {id(parameter) for parameter in module.parameters()}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["params"] = [parameter for parameter in group["params"] if id(parameter) in alive]
