"""``python -m project sweep``: a hyperparameter search on Optuna, each trial a full ``python -m project fit``.

The driver (:mod:`.driver`) imports neither torch nor Lightning: it reads the space file (:mod:`.space`), checks it
against the base config once (:mod:`.setup`), keeps the study in SQLite under ``logs/sweeps/<study>/``
(:mod:`.study`), samples every trial's parameters itself and starts the trial as a ``fit`` subprocess that dies with
it (:mod:`.trials`), then prints and saves the results (:mod:`.report`, :mod:`.plots`). Inside a trial,
:mod:`.pruning` reports the monitored metric at each validation and stops every rank when the study's pruner says
so; :mod:`.contract` is what the two sides agree on. See docs/extras/sweep.md.

Nothing is imported here: the trial-side callback is imported on every run, and must stay light.
"""
