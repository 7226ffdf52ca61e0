"""The digits network: a plain ``nn.Module`` whose ``init_args`` let the export layer rebuild it anywhere."""

from __future__ import annotations

from torch import Tensor, nn


class DigitsNet(nn.Module):
    """MLP for 8x8 digits: ``in_features -> hidden -> hidden -> num_classes``.

    Args:
        in_features: Flattened input size (64 for 8x8 images).
        hidden: Width of the two hidden layers.
        num_classes: Number of output logits.
        dropout: Dropout probability after each hidden layer (0 turns it off).
        batch_norm: Put a BatchNorm1d after each hidden linear layer.
    """

    def __init__(
        self,
        in_features: int = 64,
        hidden: int = 256,
        num_classes: int = 10,
        dropout: float = 0.1,
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1); use 0 to turn dropout off")
        self.init_args = dict(
            in_features=in_features, hidden=hidden, num_classes=num_classes, dropout=dropout, batch_norm=batch_norm
        )
        layers: list[nn.Module] = []
        for width in (in_features, hidden):
            layers.append(nn.Linear(width, hidden))
            if batch_norm:
                layers.append(nn.BatchNorm1d(hidden))
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(hidden, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Return class logits for a batch of flattened images."""
        return self.layers(x.flatten(1))
