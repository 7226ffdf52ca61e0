"""A plain regression MLP: no Lightning import and, on purpose, no ``init_args`` (export reads the config's)."""

from __future__ import annotations

from torch import Tensor, nn


class MLP(nn.Module):
    """``depth`` Linear+ReLU layers of width ``hidden``, then a Linear to ``out_features``.

    Args:
        in_features: Input features per sample.
        hidden: Width of the hidden layers.
        out_features: Outputs per sample.
        depth: Number of hidden Linear+ReLU layers (>= 0; 0 is a linear model).
    """

    def __init__(self, in_features: int = 10, hidden: int = 64, out_features: int = 1, depth: int = 2) -> None:
        super().__init__()
        if depth < 0:
            raise ValueError(f"depth={depth} must be >= 0")
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Return ``[B, out_features]`` outputs for a ``[B, in_features]`` batch."""
        return self.layers(x)
