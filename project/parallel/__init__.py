"""In-rank: everything that runs inside the processes, driven by the plan's strategy row and its Layout.

The strategies the core's rows build (``strategies.py``: DDP; a layer builds its own rows' strategies), the
samplers that deal global batches over the data-parallel ranks, micro-batch auto,
the collectives, stops, failures and hang reports of a multi-process run. Nothing here decides a layout: the
pure ``project.plan`` did, before any process existed.
"""
