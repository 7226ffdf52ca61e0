"""The lr layer: ``parallel.learning_rate`` scales the learning rates with the global batch and warms them up."""

from project.layers import Layer

LAYER = Layer(
    name="lr",
    adds="`parallel.learning_rate`: learning rates scaled with the global batch (linear, sqrt) and a linear warmup",
    callbacks=("project.extras.lr.callback:learning_rate_callbacks",),
    on_state=("project.extras.lr.plan:take_learning_rate",),
    parallel=("project.extras.lr.config:subsections",),
)
