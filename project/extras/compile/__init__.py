"""``parallel.compile: true``: ``torch.compile`` applied in place to the module's networks after the strategy's wrap.

:mod:`.compile` holds the compilation and its callback, the plan's field and note, and the layer's hooks. See
docs/extras/compile.md.
"""
