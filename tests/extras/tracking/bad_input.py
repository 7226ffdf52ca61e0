"""The tracking layer's bad inputs, run by tests/distributed/test_bad_input.py beside the core's (same rules)."""

from helpers import DIGITS, FAST

BASE = ["--config", DIGITS, "--config", FAST]
CASES = {
    "store-uri-with-a-password": dict(
        args=("fit", *BASE, "--tracking.logger", "mlflow", "--tracking.tracking_uri", "http://me:s3cret@127.0.0.1:9"),
        needles=("MLflow cannot use the store http://me:***@127.0.0.1:9",),
        absent=("s3cret",),
    ),
}
