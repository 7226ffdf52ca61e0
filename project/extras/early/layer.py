"""The early layer: ``python -m project`` forks the ranks of a one-machine CPU run right after its imports."""

from project.layers import Layer

LAYER = Layer(
    name="early",
    adds="`python -m project` forks a CPU run's ranks right after its imports: every rank starts at once",
    around_command=("project.extras.early.fork:ranks_started_at_once",),
)
