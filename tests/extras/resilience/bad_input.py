"""The resilience layer's bad inputs, run by tests/distributed/test_bad_input.py beside the core's (same rules)."""

from helpers import DIGITS, FAST

BASE = ["--config", DIGITS, "--config", FAST]
CASES = {
    # The straggler options left the parallel section for the layer's own: an old flat name says its new key.
    "old-straggler-name-on-the-command-line": dict(
        args=("fit", *BASE, "--parallel.straggler_factor", "2"),
        needles=("parallel.straggler_factor is now stragglers.factor", "write --stragglers.factor"),
        absent=("unknown option",),
    ),
    "old-straggler-name-in-a-config-file": dict(
        args=("fit", *BASE, "--config", "{tmp}/old_stragglers.yaml"),
        needles=("parallel.straggler_every_n_steps is now stragglers.every_n_steps", "`every_n_steps:` under"),
        absent=("unknown option",),
    ),
    "straggler-factor-of-one": dict(
        args=("fit", *BASE, "--stragglers.factor", "1"),
        needles=("stragglers.factor=1.0 > 1",),
    ),
}
#: The files the cases read, written into each case's folder.
FILES = {"old_stragglers.yaml": "parallel:\n  straggler_every_n_steps: 10\n"}
