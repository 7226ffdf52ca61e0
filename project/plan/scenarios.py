"""The scenarios: one row each, its devices and strategy; nothing else branches on a scenario's name."""

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
    #: Its strategy forks the ranks itself (a notebook's way): the early layer's start-up launcher must not.
    forks_itself: bool = False
    #: How the data-parallel degree is made: every process a replica (DDP), or shards (fsdp: ``dp_shard``).
    data_parallel: Literal["replicate", "shard"] = "replicate"
    #: The degrees it composes with (``tp``: tensor parallelism; ``pp``: pipeline stages; a layer's ``degrees``).
    composes: tuple[str, ...] = ()
    #: The training loader's ``batch_size`` is the global batch, split over the GPUs (DataParallel's scatter).
    data_batch_is_global: bool = False
    #: Only one machine (DataParallel's threads), or only one GPU (``single``): ``None`` for no limit.
    max_nodes: int | None = None
    max_gpus: int | None = None


#: The core's rows; each layer adds its own (a layer's ``scenarios``). ``auto`` is not a row (:data:`AUTO_SCENARIO`).
CORE_SCENARIOS: dict[str, Scenario] = {
    "cpu": Scenario("cpu", "ddp", composes=("tp", "pp")),
    "single": Scenario("gpu", "single_device", max_gpus=1),
    # dp runs as DDP: Lightning removed DataParallel; the plan keeps DP's batch meaning.
    "dp": Scenario("gpu", "ddp", data_batch_is_global=True, max_nodes=1),
    "ddp": Scenario("gpu", "ddp", composes=("tp", "pp")),
    "fork": Scenario("any", "ddp_fork", forks_itself=True),
}
# At the end of the module: a layer's rows are Scenario instances, so its module imports this one first.
from project.layers import rows  # noqa: E402

#: Every scenario of this checkout: the core's, then each installed layer's.
SCENARIOS: dict[str, Scenario] = {**CORE_SCENARIOS, **rows("scenarios")}
#: The value of ``parallel.scenario`` that is not a row: the machine decides (project.plan.layout.resolve_scenario).
AUTO_SCENARIO = "auto"
SCENARIO_NAMES: tuple[str, ...] = (AUTO_SCENARIO, *SCENARIOS)
