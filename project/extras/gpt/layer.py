"""The gpt layer: a character-level GPT, its language model and text data, named by class path in its configs."""

from project.layers import Layer

LAYER = Layer(
    name="gpt",
    adds="a character-level GPT on Python's help text (`configs/gpt/chargpt.yaml`): tokens/s, text from `predict`",
    trusted_modules=("project.extras.gpt.gpt",),  # an export of the GPT rebuilds without trusted=
)
