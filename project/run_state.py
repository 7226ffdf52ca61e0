"""The run's state: the ``parallel`` section it resolved, its Plan as the run learns more, the loaders' guarantees.

Resolved before anything is built, the plan is completed by the training loader's batch size at ``setup('fit')``
and changed by layers (:meth:`RunState.amend`). The run directory is not here: ``trainer.log_dir`` is a collective.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from project.plan.config import Hardware, ParallelConfig
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Plan, resolve_plan


@dataclass
class RunState:
    """What one run knows about its layout, shared by the builder and the callbacks."""

    #: The ``parallel`` section as this run resolved it; ``None``: ``parallel: null`` (plain Lightning).
    section: ParallelConfig | None = None
    #: The GPUs resolved against (``--assume_gpus`` for ``plan``); ``None`` with no section.
    hardware: Hardware | None = None
    #: The plan resolved before anything was built; ``None`` for ``plan`` and with no section.
    built: Plan | None = None
    #: Stage (``training``, ``validation``, ...) -> what holds for its loaders, for ``plan.json``.
    guarantees: dict[str, dict[str, Any]] = field(default_factory=dict)
    _plan: Plan | None = None
    _changes: list[Callable[[Plan], Plan]] = field(default_factory=list)

    @property
    def plan(self) -> Plan | None:
        """The plan as far as the run knows it: ``None`` until a stage starts (then at least :attr:`built`)."""
        return self._plan

    def resolve(self, environment: LaunchEnvironment, data_batch_size: int | None) -> Plan:
        """The section resolved on this run's hardware for ``environment``, with every change :meth:`amend` holds."""
        assert self.section is not None and self.hardware is not None, "a run without a parallel section plans nothing"
        return self._amended(resolve_plan(self.section, self.hardware, environment, data_batch_size))

    def with_data_batch(self, batch_size: int | None) -> Plan:
        """The training loader's ``batch_size`` completes the built plan (every layer's change so far kept)."""
        assert self.built is not None, "a run without a parallel section installs no loaders"
        self._plan = self._amended(self.built.with_data_batch(batch_size))
        return self._plan

    def amend(self, change: Callable[[Plan], Plan]) -> Plan | None:
        """A layer's ``change`` to every plan this run makes from now on, and to the plan as far as it is known."""
        self._changes.append(change)
        if self._plan is not None:
            self._plan = change(self._plan)
        return self._plan

    def _amended(self, plan: Plan) -> Plan:
        for change in self._changes:
            plan = change(plan)
        return plan

    def evaluating(self) -> Plan | None:
        """A stage without training data: the plan is the built one, unless training completed it already."""
        if self._plan is None:
            self._plan = self.built
        return self._plan
