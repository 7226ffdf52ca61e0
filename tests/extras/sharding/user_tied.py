"""A small GPT-style language model as users write it: input and output embeddings tied, on the LightningModule.

``self.embed``, ``self.blocks`` and ``self.head`` are the module's own children (no ``self.net``), and
``self.head.weight is self.embed.weight``: the tie crosses the networks FSDP shards one by one.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    """A residual MLP block (a transformer block without attention: enough for the tie)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TiedLM(L.LightningModule):
    """Next-token prediction with the output layer tied to the input embedding."""

    def __init__(self, vocab: int = 32, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.cross_entropy(self(x).flatten(0, 1), y.flatten()), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Tokens(L.LightningDataModule):
    """Sequences of a fixed random text, next token as target."""

    def __init__(self, batch_size: int = 8, vocab: int = 32, length: int = 12, samples: int = 128) -> None:
        super().__init__()
        text = torch.randint(vocab, (samples * length + 1,), generator=torch.Generator().manual_seed(0))
        x = text[:-1].view(samples, length)
        y = text[1:].view(samples, length)
        self.train_set, self.val_set, self.batch_size = TensorDataset(x, y), TensorDataset(x[:32], y[:32]), batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)


class TiedNet(nn.Module):
    """The embedding, the blocks and the tied head as one network with a forward."""

    def __init__(self, vocab: int, width: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


class TiedNetLM(TiedLM):
    """The same model as one network, ``self.net``: the tie stays inside what FSDP shards as one root."""

    def __init__(self, vocab: int = 32, width: int = 16, depth: int = 2) -> None:
        super().__init__(vocab, width, depth)
        del self.embed, self.blocks, self.head
        self.net = TiedNet(vocab, width, depth)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens)
