"""The run's state: the ``parallel`` section it resolved, its Plan as the run learns more, the loaders' guarantees.

The builder (:class:`project.build.ProjectCLI`) makes one :class:`RunState` before anything is built and hands it
to the callbacks that need it; no callback holds the plan for the others. The plan is resolved before anything is
built (:attr:`RunState.built`); the training loader's batch size completes it at ``setup('fit')``
(:meth:`RunState.with_data_batch`), and ``micro_batch: auto`` may pick its micro-batch on the first step
(:meth:`RunState.use_micro_batch`): each replaces :attr:`RunState.plan` through a method, in that order.

The run directory is not held here: Lightning's ``trainer.log_dir`` is a collective that every rank asks once the
strategy is set up (:func:`project.runs.run_directory`), which is where its writers ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from project.plan.config import Hardware, ParallelConfig
from project.plan.resolve import Plan


@dataclass
class RunState:
    """What one run knows about its layout, shared by the builder and the callbacks.

    Attributes:
        section: The ``parallel`` section as this run resolved it (an elastic restart's batch, the check's timeout);
            ``None``: ``parallel: null`` (plain Lightning).
        hardware: The GPUs resolved against (``--assume_gpus`` for ``plan``); ``None`` with no section.
        built: The plan resolved before anything was built; ``None`` for ``plan`` (it resolves with the data) and
            with no section.
        guarantees: Stage (``training``, ``validation``, ...) -> what holds for its loaders, for ``plan.json``.
    """

    section: ParallelConfig | None = None
    hardware: Hardware | None = None
    built: Plan | None = None
    guarantees: dict[str, dict[str, Any]] = field(default_factory=dict)
    _plan: Plan | None = None
    _micro: tuple[int, tuple[tuple[int, bool], ...]] | None = None

    @property
    def plan(self) -> Plan | None:
        """The plan as far as the run knows it: ``None`` until a stage starts (then at least :attr:`built`)."""
        return self._plan

    def with_data_batch(self, batch_size: int | None) -> Plan:
        """The training loader's ``batch_size`` completes the built plan (the micro-batch picked so far kept).

        Raises:
            UserError: the batch fields and the layout cannot hold together (see :meth:`Plan.with_data_batch`).
        """
        assert self.built is not None, "a run without a parallel section installs no loaders"
        plan = self.built.with_data_batch(batch_size)
        self._plan = plan.with_micro_batch(*self._micro) if self._micro is not None else plan
        return self._plan

    def use_micro_batch(self, micro: int, trials: tuple[tuple[int, bool], ...]) -> Plan:
        """``micro_batch: auto`` picked ``micro`` (after ``trials``): the plan says so, now and once completed again."""
        assert self._plan is not None, "the micro-batch is picked after the training loader completed the plan"
        self._micro = (micro, trials)
        self._plan = self._plan.with_micro_batch(micro, trials)
        return self._plan

    def evaluating(self) -> Plan | None:
        """A stage without training data: the plan is the built one, unless training completed it already."""
        if self._plan is None:
            self._plan = self.built
        return self._plan
