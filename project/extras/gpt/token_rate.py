"""Tokens per second of training, from the host's clock: no device sync of its own.

The clock is read once per step (``time.perf_counter``, no sync) and the rate is reported on the steps whose
metrics the Trainer writes. On a GPU those steps already wait for the device (Lightning turns the logged loss
into a number), so a rate over a window of logged steps counts the device's work, up to the queue it runs ahead.
Time spent validating between two reports is left out: the rate is of training.
"""

from __future__ import annotations

import time


class TokenRate:
    """Count tokens between reports and turn them into tokens per second of training time."""

    def __init__(self) -> None:
        self._tokens = 0
        self._since: float | None = None  # when the current window started; None before the first step
        self._paused_at: float | None = None

    def step(self, tokens: int) -> None:
        """Count one training step's tokens (call at the start of the step: its time then counts too)."""
        if self._since is None:
            self._since = time.perf_counter()
        self._tokens += tokens

    def pause(self) -> None:
        """Stop the clock (validation starts)."""
        if self._since is not None and self._paused_at is None:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        """Restart the clock (validation ended): the pause does not count."""
        if self._paused_at is not None and self._since is not None:
            self._since += time.perf_counter() - self._paused_at
        self._paused_at = None

    def report(self) -> float | None:
        """Tokens per second since the last report (``None`` before any step), and a new window starts."""
        if self._since is None or self._tokens == 0:
            return None
        now = time.perf_counter()
        rate = self._tokens / max(now - self._since, 1e-9)
        self._tokens, self._since = 0, now
        return rate
