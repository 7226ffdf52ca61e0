"""Hyperparameters that are safe to checkpoint: the config's class_path/init_args, never a live network."""

from __future__ import annotations

import inspect
import warnings

import lightning as L
from torch import nn


def save_config_hyperparameters(module: L.LightningModule, network: str) -> None:
    """``module.save_hyperparameters()`` for the caller's ``__init__``, without pickling a live ``network`` module."""
    frame = inspect.currentframe().f_back  # the caller's __init__, whose arguments are the hyperparameters
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice to ignore a module argument: done just below
        module.save_hyperparameters(frame=frame)
    if isinstance(module.hparams.get(network), nn.Module):
        module.save_hyperparameters(ignore=[network], frame=frame)
