"""The ray layer: ``--parallel.launcher ray`` submits the command as a Ray Train job and waits."""

from project.layers import Layer

LAYER = Layer(
    name="ray",
    adds="`--parallel.launcher ray`: the same command as a Ray Train job of one worker per rank, on any Ray cluster",
    submit=("project.extras.ray.job:submitter",),
)
