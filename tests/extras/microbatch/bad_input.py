"""The microbatch layer's bad inputs, run by tests/distributed/test_bad_input.py beside the core's (same rules)."""

from helpers import DIGITS, FAST

BASE = ["--config", DIGITS, "--config", FAST]
CASES = {
    "micro-batch-auto-on-a-stream": dict(
        args=("fit", *BASE, "--data.class_path", "user_code.StreamedDigits", "--parallel.micro_batch", "auto"),
        needles=("parallel.micro_batch='auto'", "is a stream", "set parallel.micro_batch to a number"),
    ),
}
#: The files the cases read (none).
FILES: dict[str, str] = {}
