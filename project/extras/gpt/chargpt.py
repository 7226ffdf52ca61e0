"""The character-level GPT's data: Python's bundled help text, split 90/10 by position, read as windows."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from project.data.base import TensorDataModule
from project.extras.gpt.chartext import TextWindows, encode, load_corpus, split_at, strided_starts, vocabulary


class CharTextDataModule(TensorDataModule):
    """Windows of ``pydoc_data.topics`` (:func:`project.extras.gpt.chartext.load_corpus`) for next-character prediction.

    Training samples are windows of ``block_size + 1`` characters at every start position of the first
    ``1 - val_fraction`` of the text, drawn at random (an epoch is every start once). Validation is a fixed set:
    non-overlapping windows of the last ``val_fraction``, the first ``val_windows`` of them. ``predict`` runs over
    ``prompts``: the module continues each one (``project.extras.gpt.language_model``).

    Args:
        block_size: Characters the model sees per sample (at most the network's ``block_size``).
        val_fraction: Share of the text, at its end, held out for validation.
        val_windows: At most this many validation windows (``None``: all of them, 363 at block_size 128).
        prompts: The texts ``predict`` continues, one row of ``predictions.csv`` each.
        **loader: Loader settings of :class:`project.data.base.TensorDataModule`
            (``batch_size``, ``num_workers``, ``pin_memory``, ``persistent_workers``, ``shuffle``, ``seed``).
    """

    def __init__(
        self,
        block_size: int = 128,
        val_fraction: float = 0.1,
        val_windows: int | None = None,
        prompts: list[str] | None = None,
        **loader: Any,
    ) -> None:
        super().__init__(**loader)
        self.save_hyperparameters()
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be >= 1")
        if val_windows is not None and val_windows < 1:
            raise ValueError(f"val_windows={val_windows} must be >= 1 (or null for all)")
        split_at(1, val_fraction)  # checks the fraction before any process starts
        self.block_size = block_size
        self.val_fraction = val_fraction
        self.val_windows = val_windows
        self.prompts = list(prompts) if prompts is not None else ["\n"]
        if not self.prompts or not all(isinstance(p, str) and p for p in self.prompts):
            raise ValueError("prompts must be a list of non-empty strings")
        #: The corpus's characters in token order, once set up; the network must have been built with the same.
        self.vocab: str | None = None
        self.predict_set: list[str] | None = None

    def setup(self, stage: str | None = None) -> None:
        """Read the corpus (no download: it ships with Python), encode it and cut the windows (fast: ~50 ms)."""
        if self.vocab is not None:
            return
        text = load_corpus()
        self.vocab = vocabulary(text)
        tokens = encode(text, self.vocab)
        cut = split_at(len(tokens), self.val_fraction)
        train, val = tokens[:cut], tokens[cut:]
        self.train_set = TextWindows(train, self.block_size)
        self.val_set = TextWindows(val, self.block_size, strided_starts(len(val), self.block_size, self.val_windows))
        self.predict_set = list(self.prompts)

    def predict_dataloader(self) -> DataLoader:
        """The prompts, a batch of strings at a time (the default collate keeps strings as a list)."""
        return self._loader(self.predict_set, "predict")
