"""The scenarios: one row each, what devices it runs on and which strategy of the table runs it.

This is the whole of a scenario outside its strategy's row (:mod:`project.plan.strategies`): the config's choices,
the layout and the start-up launcher read it, and nothing else branches on a scenario's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Scenario:
    """One scenario of ``parallel.scenario``."""

    #: "cpu", "gpu", or "any" (the GPUs when the machine has some, else CPU processes).
    devices: Literal["cpu", "gpu", "any"]
    #: The strategy (a row of :data:`project.plan.strategies.STRATEGIES`) on more than one process.
    strategy: str
    #: Its strategy forks the ranks from this process itself (a notebook's way), so the template's start-up
    #: launcher (:mod:`project.launch.early`) must not start them first.
    forks_itself: bool = False


#: ``auto`` is not a row: it becomes ``ddp``, ``single`` or ``cpu`` for the machine (project.plan.layout).
SCENARIOS: dict[str, Scenario] = {
    "cpu": Scenario("cpu", "ddp"),
    "single": Scenario("gpu", "single_device"),
    # dp runs as DDP: Lightning removed DataParallel; the plan keeps DP's batch meaning.
    "dp": Scenario("gpu", "ddp"),
    "ddp": Scenario("gpu", "ddp"),
    "fork": Scenario("any", "ddp_fork", forks_itself=True),
    "fsdp": Scenario("any", "fsdp"),
    # DDP whose optimizer state is sharded over the ranks (ZeroRedundancyOptimizer): project/parallel/zero1.py.
    "zero1": Scenario("any", "zero1"),
}
#: Every value ``parallel.scenario`` takes.
SCENARIO_NAMES: tuple[str, ...] = ("auto", *SCENARIOS)
