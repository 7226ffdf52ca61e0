"""The processes of a run: what started them, what they do when it dies or signals, ranks started outside Lightning.

An outside launcher's elastic restarts (:mod:`.elastic`), torch.distributed.launch's ``--local_rank``
(:mod:`.legacy`), a rank that dies with its launcher (:mod:`.orphans`), the stop signals (:mod:`.stop_signals`),
and the registry of ranks a layer started itself (:mod:`.ranks`; the early layer forks a CPU run's ranks at once).
"""
