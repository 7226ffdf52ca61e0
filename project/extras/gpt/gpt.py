"""A nanoGPT-style character-level decoder: a plain ``nn.Module`` that imports nothing from Lightning.

Token and position embeddings, ``n_layer`` pre-norm blocks (LayerNorm -> causal self-attention -> residual,
LayerNorm -> MLP -> residual), a final LayerNorm and the language-model head. The projections are separate
``nn.Linear`` modules with stable names (``attn.q_proj``, ``attn.k_proj``, ``attn.v_proj``, ``attn.out_proj``,
``mlp.up``, ``mlp.down``), so a tensor-parallel plan can address them: column-wise for q/k/v/up, row-wise for
out/down. Attention reads its local number of heads from ``q_proj``'s output at forward time, so column-sharded
q/k/v (fewer heads per rank) need no change here.

The network records its constructor arguments in ``init_args``, its vocabulary included, so an export
(``project.extras.export.weights``) rebuilds it and decodes its tokens without the corpus.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``scaled_dot_product_attention(is_causal=True)``.

    Args:
        n_embd: Width of the residual stream.
        n_head: Number of heads (all ranks together, when q/k/v are sharded by columns).
        dropout: Dropout on the attention weights and on the output, while training.
        bias: Biases on the projections.
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} must be a multiple of n_head={n_head}")
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        self.dropout = dropout
        self.q_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.k_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.v_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.out_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, T, C] -> [B, T, C]``: each position attends to itself and the positions before it."""
        batch, steps, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        # The heads this rank holds: all of them, or its share when q/k/v are sharded by output columns.
        heads = q.shape[-1] // self.head_dim
        q, k, v = (t.view(batch, steps, heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).reshape(batch, steps, heads * self.head_dim)
        return self.resid_dropout(self.out_proj(y))


class MLP(nn.Module):
    """The feed-forward part of a block: ``n_embd -> 4 n_embd -> GELU -> n_embd``, then dropout."""

    def __init__(self, n_embd: int, dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.down = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``[..., C] -> [..., C]``."""
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    """One pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, T, C] -> [B, T, C]``."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A character-level GPT: token ids ``[B, T]`` in, next-token logits ``[B, T, vocab_size]`` out.

    Args:
        vocab: The characters it reads and writes, token ``i`` being ``vocab[i]``; ``None``: the vocabulary of
            the bundled corpus (:func:`project.extras.gpt.chartext.corpus_vocabulary`). The resolved string is what
            ``init_args`` records, so an export carries it.
        block_size: The longest context (positions with an embedding).
        n_layer: Transformer blocks.
        n_head: Attention heads per block.
        n_embd: Width of the residual stream (a multiple of ``n_head``).
        dropout: Dropout after the embeddings, on attention and after each residual branch (0 turns it off).
        bias: Biases in the Linear layers and LayerNorms; off as in nanoGPT (a key bias has no gradient at all:
            softmax does not change when a constant is added to every score of a query).
        tie_weights: Share the token embedding with the language-model head (nanoGPT does).
    """

    def __init__(
        self,
        vocab: str | None = None,
        block_size: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        bias: bool = False,
        tie_weights: bool = False,
    ) -> None:
        super().__init__()
        if vocab is None:
            from project.extras.gpt.chartext import corpus_vocabulary  # only here: a rebuilt export names its vocab

            vocab = corpus_vocabulary()
        if not vocab or len(set(vocab)) != len(vocab):
            raise ValueError("vocab must be a non-empty string of distinct characters")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1); use 0 to turn dropout off")
        if min(block_size, n_layer, n_head, n_embd) < 1:
            raise ValueError("block_size, n_layer, n_head and n_embd must be >= 1")
        self.init_args = {
            "vocab": vocab,
            "block_size": block_size,
            "n_layer": n_layer,
            "n_head": n_head,
            "n_embd": n_embd,
            "dropout": dropout,
            "bias": bias,
            "tie_weights": tie_weights,
        }
        self.vocab = vocab
        self.block_size = block_size
        self.tok_emb = nn.Embedding(len(vocab), n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, len(vocab), bias=False)
        if tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self._init_weights(n_layer)

    @property
    def vocab_size(self) -> int:
        """Number of tokens (characters)."""
        return len(self.vocab)

    def _init_weights(self, n_layer: int) -> None:
        """GPT-2's initialisation: N(0, 0.02), the residual projections scaled down by sqrt(2 n_layer)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        # Each block adds two branches to the residual stream: keep its variance from growing with depth.
        for block in self.blocks:
            for projection in (block.attn.out_proj, block.mlp.down):
                nn.init.normal_(projection.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: Tensor) -> Tensor:
        """Next-token logits ``[B, T, vocab_size]`` of token ids ``[B, T]`` (``T <= block_size``).

        As a pipeline stage, the modules of other stages are ``nn.Identity``: without the embeddings the input is
        a hidden state ``[B, T, n_embd]``; without ``ln_f``/``lm_head`` the output is one.
        """
        steps = idx.shape[1]
        if steps > self.block_size:
            raise ValueError(f"a sequence of {steps} tokens is longer than block_size={self.block_size}")
        if isinstance(self.tok_emb, nn.Identity):
            # A later pipeline stage (the sharding layer's pipeline): its input is the previous stage's hidden state.
            x = idx
        else:
            positions = torch.arange(steps, device=idx.device)
            x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))
