"""The diabetes layer's bench: the ``regression`` task (``Regressor``, MSE, a plain datamodule) and its row."""
