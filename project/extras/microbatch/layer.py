"""The microbatch layer: ``parallel.micro_batch: auto``, searched at the start of ``fit`` and split finer on demand."""

from project.layers import Layer

LAYER = Layer(
    name="microbatch",
    adds="`parallel.micro_batch: auto`: the largest micro-batch that fits on every rank, split finer on out-of-memory",
    callbacks=("project.extras.microbatch.search:micro_batch_callbacks",),
    on_state=("project.extras.microbatch.plan:take_auto",),
)
