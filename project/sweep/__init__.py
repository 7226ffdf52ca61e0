"""``python -m project sweep``: a hyperparameter search on Optuna, each trial a full ``python -m project fit``.

The driver (:mod:`project.sweep.driver`) imports neither torch nor Lightning: it reads the space file
(:mod:`~project.sweep.space`), checks it against the base config once (:mod:`~project.sweep.setup`), keeps the study
in SQLite under ``logs/sweeps/<study>/`` (:mod:`~project.sweep.study`), samples every trial's parameters itself and
starts the trial as a ``fit`` subprocess that dies with it (:mod:`~project.sweep.trials`), then prints and saves the
results (:mod:`~project.sweep.report`, :mod:`~project.sweep.plots`). Inside a trial,
:mod:`~project.sweep.pruning` reports the monitored metric at each validation and stops every rank when the study's
pruner says so; :mod:`~project.sweep.contract` is what the two sides agree on. See docs/sweeps.md.

Nothing is imported here: the trial-side callback is imported on every run, and must stay light.
"""
