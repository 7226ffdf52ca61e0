"""CPU threads per process: an even share of the cores, overridable, and a warning when processes exceed cores."""

from __future__ import annotations

import pytest
import torch

from project.errors import UserError
from project.parallel.threads import apply_cpu_threads, available_cores, oversubscription, threads_per_process


@pytest.mark.parametrize(
    ("processes", "cores", "asked", "threads"),
    [(1, 2, None, 2), (2, 2, None, 1), (4, 2, None, 1), (2, 16, None, 8), (3, 16, None, 5), (2, 2, 3, 3)],
)
def test_each_process_gets_an_even_share_of_the_cores(processes, cores, asked, threads):
    assert threads_per_process(processes, cores, asked) == threads


def test_a_thread_count_below_one_is_refused():
    with pytest.raises(UserError, match=r"parallel\.cpu_threads=0 must be >= 1"):
        threads_per_process(1, 2, 0)


def test_more_processes_than_cores_is_one_warning_line():
    assert oversubscription(2, 2) is None
    line = oversubscription(8, 2)
    assert line.startswith("warning: 8 processes on 2 CPU cores") and "parallel.devices <= 2" in line
    assert "\n" not in line


def test_the_share_is_applied_to_this_process(monkeypatch, capsys):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        apply_cpu_threads(available_cores() + 1, None, rank=0)
        assert torch.get_num_threads() == 1
        assert "warning:" in capsys.readouterr().err
        apply_cpu_threads(1, 3, rank=1)
        assert torch.get_num_threads() == 3
        assert capsys.readouterr().err == ""
    finally:
        torch.set_num_threads(before)
