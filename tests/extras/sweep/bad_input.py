"""The sweep layer's bad inputs, run by tests/distributed/test_bad_input.py beside the core's (same rules)."""

from helpers import DIGITS, FAST

BASE = ["--config", DIGITS, "--config", FAST]
CASES = {
    "sweep-space-the-base-config-does-not-take": dict(
        args=("sweep", *BASE, "--sweep", "{tmp}/typo.yaml"),
        needles=("does not take the sweep's keys", "learning_rate"),
    ),
    "old-flat-name-in-a-sweep-space": dict(
        args=("sweep", *BASE, "--sweep", "{tmp}/old_space.yaml"),
        needles=(
            "old_space.yaml",
            "does not take the sweep's keys",
            "parallel.broadcast_buffers is now parallel.ddp.broadcast_buffers",
        ),
    ),
}
#: The files the cases read, written into each case's folder.
FILES = {
    "typo.yaml": "parameters:\n  optimizer.init_args.learning_rate: {type: float, low: 0.1, high: 1}",
    "old_space.yaml": "parameters:\n  parallel.broadcast_buffers: {type: categorical, choices: [true, false]}",
}
