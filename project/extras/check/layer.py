"""The check layer: ``python -m project check``, a self-test of the real layout before a long job."""

from project.commands import Builds, Command
from project.layers import Layer

LAYER = Layer(
    name="check",
    adds="`python -m project check`: ranks, collectives, bandwidth, invariance and step time of the real layout",
    commands=(
        Command(
            "check",
            "self-test the layout: ranks, collectives, bandwidth, invariance, step time (check.json)",
            Builds.TRAINER,
            "fit",
            self_test=True,
            starts_ranks_early=True,
            arguments="project.extras.check.command:add_check_arguments",
            settings="project.extras.check.command:check_settings",
            trainer_kwargs="project.extras.check.command:check_trainer_kwargs",
        ),
    ),
)
