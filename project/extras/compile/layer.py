"""The compile layer: ``parallel.compile: true`` compiles the module's networks in place after the DDP/FSDP wrap."""

from project.layers import Layer

LAYER = Layer(
    name="compile",
    adds="`parallel.compile: true`: torch.compile of the module's networks in place, after the DDP/FSDP wrap",
    callbacks=("project.extras.compile.compile:compile_callbacks",),
    on_state=("project.extras.compile.compile:take_compile",),
)
