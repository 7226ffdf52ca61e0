"""Checkpoints: safe loading and the pickle policy, atomic writes, the newest good one, state-dict diffs.

Submodules are imported by name (``project.checkpoints.loading`` ...): ``loading``, ``atomic`` and ``diff`` import
no Lightning, so a plain process that rebuilds an exported network never pays for it.
"""
