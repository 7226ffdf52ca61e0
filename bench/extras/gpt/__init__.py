"""The GPT layer's bench: the ``chargpt`` task, ``python -m bench --chargpt`` and ``--pipeline``, its results."""
