"""Experiment tracking beside TensorBoard: one MLflow run per training, across ranks, restarts and preemptions.

The ``tracking`` config section (:mod:`project.extras.tracking.config`) turns it on; ``configs/tracking/mlflow.yaml``
sets it. :func:`project.extras.tracking.attach.attach_tracking` checks the store before anything is written and adds
:class:`project.extras.tracking.callback.TrackingCallback`, which opens (or reopens) the run on rank 0, tells every rank
its id and keeps that id in every checkpoint. Nothing here imports mlflow until a run is tracked
(:mod:`.store` and :mod:`.mlflow_logger` do, and only they are imported lazily).
"""
