"""The resilience layer: a hang names itself, an elastic job survives a lost node, a straggler is named.

``hang`` (at a stall every rank's stacks and last collectives in ``<run>/hang/``, one line naming the stuck rank),
``elastic`` (torchrun ``--nnodes MIN:MAX``: a survivor saves alone, a restart keeps the checkpoint's global batch,
``membership.json``), ``stragglers`` (each rank's compute time gathered every N steps, a slow rank named; the
``stragglers`` config section) and ``hooks`` (what ``layer.py`` plugs into the core).
"""
