"""The guards layer: the non-finite loss check, replica agreement at every save, the trainable set under DDP."""

from project.layers import Layer

LAYER = Layer(
    name="guards",
    adds="a nan/inf loss stops or skips the step, diverged DDP replicas stop at the next save, fine-tuning under DDP",
    sections=("project.extras.guards.config:add_nonfinite_section",),
    callbacks=("project.extras.guards.hooks:guard_callbacks",),
)
