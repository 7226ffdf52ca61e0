"""The sweep layer: ``python -m project sweep`` and the trial's callback in every fit a sweep starts."""

from project.commands import Builds, Command
from project.layers import Layer

LAYER = Layer(
    name="sweep",
    adds="`python -m project sweep`: hyperparameter search on Optuna, each trial a fit (pruning, SQLite study, plots)",
    commands=(
        Command(
            "sweep",
            "search hyperparameters on Optuna, each trial a fit (--sweep configs/sweep/FILE.yaml)",
            Builds.DRIVER,
            runner="project.extras.sweep.driver:main",
        ),
    ),
    callbacks=("project.extras.sweep.pruning:sweep_trial_callbacks",),
)
