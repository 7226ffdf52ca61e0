"""Callbacks: the seed's barrier, its ``model.module`` unwrapping for evaluation and export, run records."""

from project.callbacks.barrier import BarrierCallback
from project.callbacks.predictions import PredictionsWriter
from project.callbacks.progress import ProgressBar
from project.callbacks.run_record import RunRecordCallback
from project.callbacks.unwrap import UnwrapEvalCallback

__all__ = ["BarrierCallback", "PredictionsWriter", "ProgressBar", "RunRecordCallback", "UnwrapEvalCallback"]
