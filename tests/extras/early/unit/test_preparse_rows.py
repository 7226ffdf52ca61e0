"""The early layer's pre-parse reads the command's row: it forks ranks only for a command that starts them early."""

from __future__ import annotations

import pytest

from project.commands import COMMANDS
from project.extras.early.preparse import processes_to_start


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_pre_parse_forks_ranks_only_for_a_command_that_starts_them(name, tmp_path):
    """Two CPU processes: forked at once for a row that starts its ranks early, left alone for any other."""
    config = tmp_path / "two.yaml"
    config.write_text("parallel:\n  devices: 2\n")
    started = processes_to_start([name, "--config", str(config)], environ={}, gpus_possible=False)
    assert started == (2 if COMMANDS[name].starts_ranks_early else None)
