"""The lr layer: ``parallel.learning_rate``, learning rates scaled with the global batch and warmed up.

:mod:`.config` holds the subsection, :mod:`.plan` its checks, the plan's ``learning_rate`` entry and note (the
layer's ``on_state`` hook), :mod:`.callback` what the optimizers get (the layer's ``callbacks`` hook). See
docs/extras/lr.md.
"""
