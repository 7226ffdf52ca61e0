"""The tracking layer: the ``tracking`` config section and MLflow beside TensorBoard for every fit."""

from project.layers import Layer

LAYER = Layer(
    name="tracking",
    adds="the `tracking` section: one MLflow run per training, across ranks, restarts and preemptions",
    sections=("project.extras.tracking.config:add_tracking_section",),
    on_trainer=("project.extras.tracking.attach:attach_tracking",),
)
