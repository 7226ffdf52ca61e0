"""The guards layer's bad inputs, run by tests/distributed/test_bad_input.py beside the core's (same rules)."""

from helpers import DIGITS, FAST

BASE = ["--config", DIGITS, "--config", FAST]
CASES = {
    "nonfinite-skip-checked-every-10-steps": dict(
        args=("fit", *BASE, "--nonfinite.action", "skip"),
        needles=("nonfinite.action: skip needs nonfinite.check_every_n_steps: 1 (got 10)",),
    ),
}
