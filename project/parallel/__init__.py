"""In-rank: what runs inside the processes, driven by the plan's strategy row and its Layout.

Strategies, the samplers that deal global batches over the data-parallel ranks, collectives, stops and failures.
Nothing here decides a layout: the pure ``project.plan`` did, before any process existed.
"""
