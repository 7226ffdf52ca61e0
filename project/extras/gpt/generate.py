"""Text from a language model, without Lightning: ``generate`` on token ids, ``complete`` on strings.

Reproducible by construction: sampling draws from a ``torch.Generator`` of its own, seeded per call, so the
same network, prompt and seed give the same text in training's ``predict`` and in a plain process that rebuilt
the export (``project.extras.export.weights.rebuild``); ``temperature=0`` is greedy decoding and draws nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from project.extras.gpt.chartext import decode, encode


@torch.no_grad()
def generate(
    net: nn.Module,
    prompt_ids: Tensor | list[int],
    n_new: int,
    temperature: float = 1.0,
    seed: int | None = 0,
    top_k: int | None = None,
) -> Tensor:
    """The prompt's token ids followed by ``n_new`` generated ones (1-D, on the network's device).

    The network maps ``[1, T]`` ids to ``[1, T, vocab]`` logits and has a ``block_size`` (the context it
    sees: the last ``block_size`` tokens). It is run in eval mode (no dropout) and put back as it was.

    Args:
        net: The language model, e.g. :class:`project.extras.gpt.gpt.GPT`.
        prompt_ids: At least one token id.
        n_new: Tokens to generate.
        temperature: Softmax temperature; ``0`` picks the most likely token each time (greedy).
        seed: Seed of this call's sampling generator; ``None`` draws from torch's global generator.
        top_k: Sample among the ``top_k`` most likely tokens only (``None``: all).

    Raises:
        ValueError: an empty prompt, a negative ``n_new`` or ``temperature``, or ``top_k < 1``.
    """
    device = next(net.parameters()).device
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).reshape(-1)
    if ids.numel() == 0 or n_new < 0 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError("generate needs a prompt of >= 1 token, n_new >= 0, temperature >= 0 and top_k >= 1")
    generator = None
    if seed is not None and temperature > 0:
        generator = torch.Generator(device=device).manual_seed(seed)
    was_training = net.training
    net.eval()
    try:
        for _ in range(n_new):
            logits = net(ids[-net.block_size :][None])[0, -1].float()
            ids = torch.cat([ids, _next_token(logits, temperature, top_k, generator)])
    finally:
        net.train(was_training)
    return ids


def _next_token(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    """One token id (shape ``[1]``) from the last position's logits."""
    if temperature == 0:
        return logits.argmax().reshape(1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


def complete(
    net: nn.Module,
    prompt: str,
    n_new: int,
    temperature: float = 1.0,
    seed: int | None = 0,
    top_k: int | None = None,
) -> str:
    """The ``n_new`` characters a character-level network (with a ``vocab`` string) writes after ``prompt``.

    Args:
        net: The network, e.g. :class:`project.extras.gpt.gpt.GPT` or one rebuilt from an export.
        prompt: Text made of the network's characters.
        n_new: Characters to generate.
        temperature: See :func:`generate`.
        seed: See :func:`generate`.
        top_k: See :func:`generate`.
    """
    ids = generate(net, encode(prompt, net.vocab), n_new, temperature, seed, top_k)
    return decode(ids[len(prompt) :], net.vocab)
