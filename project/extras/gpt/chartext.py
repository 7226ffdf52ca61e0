"""Character-level text without Lightning: the corpus that ships with Python, its vocabulary and windows of it.

The corpus is ``pydoc_data.topics.topics`` (the text of ``help()``'s topics, about 465 KB of English and code),
so nothing is downloaded. Its vocabulary is every character it holds, sorted by code point: the same text always
gives the same token ids. The network keeps the vocabulary string it was built with (``project.extras.gpt.gpt``), so
generation never needs the corpus again.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset


def load_corpus() -> str:
    """The text of Python's bundled ``pydoc_data.topics``: its values joined in sorted key order."""
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


def vocabulary(text: str) -> str:
    """Every character of ``text`` once, sorted by code point: token ``i`` is character ``i``."""
    return "".join(sorted(set(text)))


def corpus_vocabulary() -> str:
    """The vocabulary of :func:`load_corpus` (103 characters on CPython 3.11)."""
    return vocabulary(load_corpus())


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def encode(text: str, vocab: str) -> Tensor:
    """Token ids (``int64``) of ``text`` under ``vocab``.

    Raises:
        ValueError: ``text`` holds a character that ``vocab`` does not (named in the message).
    """
    known = _code_points(vocab)
    if len(known) > 1 and bool((np.diff(known.astype(np.int64)) <= 0).any()):
        raise ValueError("vocab must be sorted by code point with each character once (see vocabulary())")
    codes = _code_points(text)
    ids = np.searchsorted(known, codes)  # a vectorised lookup: 465 KB in milliseconds, not a Python loop
    found = np.zeros(len(codes), dtype=bool)
    inside = ids < len(known)
    found[inside] = known[ids[inside]] == codes[inside]
    if not found.all():
        missing = sorted({chr(c) for c in codes[~found]})
        raise ValueError(f"characters {missing[:10]} are not in the vocabulary of {len(vocab)} characters")
    return torch.from_numpy(ids.astype(np.int64))


def decode(ids: Tensor | list[int], vocab: str) -> str:
    """The text of token ``ids`` under ``vocab``."""
    values = ids.tolist() if isinstance(ids, Tensor) else ids
    return "".join(vocab[i] for i in values)


def split_at(length: int, val_fraction: float) -> int:
    """Where the training text ends: the first ``1 - val_fraction`` of ``length`` characters train.

    Raises:
        ValueError: ``val_fraction`` not in (0, 1).
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be in (0, 1)")
    return round(length * (1.0 - val_fraction))


class TextWindows(Dataset):
    """Windows of ``block_size + 1`` tokens of one text: sample ``i`` starts at ``starts[i]``.

    A sample is ``(x, y)``: the window's first ``block_size`` tokens and the same shifted by one (the next
    character at each position). A map-style dataset of start positions, so the template's samplers shuffle
    and deal them over the ranks like any other samples. A batch is gathered at once (``__getitems__``),
    already collated: its loader needs ``collate_fn=project.data.base.collated``.

    Args:
        tokens: The text's token ids (1-D).
        block_size: Tokens the model sees per sample.
        starts: The first position of each window; ``None``: every position that leaves a full window.
    """

    #: Tells :class:`project.data.base.TensorDataModule` that batches come out collated (``__getitems__``).
    returns_batches = True

    def __init__(self, tokens: Tensor, block_size: int, starts: Tensor | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be >= 1")
        last = len(tokens) - block_size - 1  # the last start that still has block_size + 1 tokens
        if last < 0:
            raise ValueError(f"a text of {len(tokens)} tokens holds no window of block_size + 1 = {block_size + 1}")
        self.tokens = tokens
        self.block_size = block_size
        self.starts = torch.arange(last + 1) if starts is None else starts.to(torch.long)
        if len(self.starts) and (int(self.starts.min()) < 0 or int(self.starts.max()) > last):
            raise ValueError(f"window starts must lie in [0, {last}]")
        self._offsets = torch.arange(block_size + 1)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        window = self.tokens[self.starts[index] + self._offsets]
        return window[:-1], window[1:]

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        windows = self.tokens[self.starts[torch.as_tensor(indices, dtype=torch.long)][:, None] + self._offsets]
        return [windows[:, :-1], windows[:, 1:]]


def strided_starts(length: int, block_size: int, limit: int | None = None) -> Tensor:
    """Starts of non-overlapping windows of ``block_size + 1`` tokens over a text of ``length``: the first ``limit``.

    Consecutive windows share one token (the last target of one is the first input of the next), so every
    position of the text but the first is predicted once.
    """
    starts = torch.arange(0, max(length - block_size, 0), block_size)
    return starts if limit is None else starts[:limit]
