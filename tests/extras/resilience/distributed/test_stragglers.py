"""Straggler detection on a real 2-process fit, and the window arithmetic it rests on."""

from __future__ import annotations

import pytest

from project.callbacks.interval_timer import IntervalTimer
from project.extras.resilience.stragglers import Window

from helpers import CPU_DDP, DIGITS, FAST, read_scalars, run_cli, run_dirs


def test_a_window_compares_each_rank_with_the_median_of_the_others():
    window = Window(0, 10, (0.010, 0.011, 0.030, 0.009))
    assert window.slowest == 2
    assert window.ratio(2) == pytest.approx(0.030 / 0.010)
    # With two ranks the median of all would be their mean, and one rank could never be 1.5x it unless 3x slower.
    assert Window(0, 10, (0.010, 0.016)).ratio(1) == pytest.approx(1.6)


def test_the_clock_sums_closed_intervals_only():
    clock = IntervalTimer()
    clock.start()
    clock.stop()
    clock.start()
    clock.cancel()
    clock.stop()  # nothing open: ignored
    assert clock.intervals == 1
    assert 0 <= clock.take() < 0.1
    assert clock.take() == 0.0


def test_a_slowed_rank_is_logged_and_named_once(tmp_path):
    slow = ["--trainer.callbacks+=faults.SlowRank", "--trainer.callbacks.init_args.sleep_s", "0.04"]
    args = ["fit", "--config", DIGITS, "--config", FAST, "--config", CPU_DDP, "--trainer.max_epochs", "1"]
    result = run_cli([*args, "--stragglers.every_n_steps", "3", "--test_after_fit", "false", *slow], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "straggler" in line]
    assert len(warnings) == 1, result.stderr[-3000:]
    assert warnings[0].startswith("warning: rank 1 (") and ", cpu)" in warnings[0], warnings[0]
    scalars = read_scalars(run_dirs(tmp_path)[-1])
    slowest = [value for _, value in scalars["ranks/slowest"]]
    # 1257 samples at 64 per process and 2 processes: 9 optimizer steps, so windows end at steps 3, 6 and 9.
    assert [step for step, _ in scalars["ranks/slowest"]] == [3, 6, 9] and set(slowest) == {1.0}, slowest
    high = [value for _, value in scalars["ranks/step_s_max"]]
    low = [value for _, value in scalars["ranks/step_s_min"]]
    # Rank 1's own time holds the 40 ms sleep; rank 0's does not (its wait is in the all-reduce, not measured).
    # The first window is warm-up: its first step's interval starts after the sleep (the hook runs first).
    assert all(h >= 0.04 and lo < h / 1.5 for h, lo in zip(high[1:], low[1:])), (high, low)


def test_one_process_and_off_log_nothing(tmp_path):
    args = ["fit", "--config", DIGITS, "--config", FAST, "--trainer.max_steps", "8", "--test_after_fit", "false"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not any(key.startswith("ranks/") for key in read_scalars(run_dirs(tmp_path)[-1]))
