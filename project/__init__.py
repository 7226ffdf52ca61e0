"""A PyTorch Lightning training template: the seed's DP and DDP recipes as one config choice."""

__version__ = "0.1.0"
