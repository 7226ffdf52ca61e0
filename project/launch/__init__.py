"""The processes of a run: what started them, what they do when it dies or signals, ranks started outside Lightning.

Modules: legacy (``--local_rank``), orphans (die with the launcher), stop_signals, ranks (a layer's), submit.
"""
