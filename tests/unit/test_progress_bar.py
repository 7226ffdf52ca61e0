"""The template's progress bar shows what Lightning's shows, the run's version as a version."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger

from project.callbacks.progress import ProgressBar


def test_the_version_reads_as_a_whole_number_not_a_metric(tmp_path):
    bar = ProgressBar()
    trainer = L.Trainer(logger=CSVLogger(tmp_path, version=0), callbacks=[bar], enable_checkpointing=False)
    items = bar.get_metrics(trainer, BoringModel())
    assert items["v_num"] == "0"
