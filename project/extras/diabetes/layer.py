"""The diabetes layer: a regression example (``Regressor``, a plain datamodule), named by class path in its config."""

from project.layers import Layer

LAYER = Layer(
    name="diabetes",
    adds="a regression example (`configs/diabetes/diabetes.yaml`): `Regressor` (MSE) on a plain LightningDataModule",
)
