"""Checkpoints: safe loading and the pickle policy, atomic writes, the newest good one, state-dict diffs.

``loading``, ``atomic`` and ``diff`` import no Lightning: a plain process that rebuilds an exported network uses them.
"""
