"""The lr layer's bad inputs, run by tests/distributed/test_bad_input.py beside the core's (same rules)."""

from helpers import DIGITS, FAST

BASE = ["--config", DIGITS, "--config", FAST]
CASES = {
    # The options were flat in ``parallel`` once: an old name says its new one.
    "old-lr-flat-name-on-the-command-line": dict(
        args=("fit", *BASE, "--parallel.lr_scaling", "linear"),
        needles=("parallel.lr_scaling is now parallel.learning_rate.lr_scaling", "--parallel.learning_rate.lr_scaling"),
        absent=("unknown option",),
    ),
    "lr-scaling-without-a-reference-batch": dict(
        args=("fit", *BASE, "--parallel.learning_rate.lr_scaling", "sqrt"),
        needles=("parallel.learning_rate.lr_scaling='sqrt' needs parallel.learning_rate.reference_batch_size >= 1",),
    ),
    "negative-warmup-in-a-config-file": dict(
        args=("fit", *BASE, "--config", "{tmp}/warmup.yaml"),
        needles=("parallel.learning_rate.warmup_steps=-2 must be >= 0",),
    ),
}
#: The files the cases read, written into each case's folder.
FILES = {"warmup.yaml": "parallel:\n  learning_rate:\n    warmup_steps: -2\n"}
