"""The predictions layer: ``predict`` writes ``<run>/predictions.csv``, one row per sample, in dataset order."""

from project.layers import Layer

LAYER = Layer(
    name="predictions",
    adds="`predict` writes predictions.csv: every rank's rows gathered, each sample once, in dataset order",
    callbacks=("project.extras.predictions.hook:prediction_callbacks",),
)
