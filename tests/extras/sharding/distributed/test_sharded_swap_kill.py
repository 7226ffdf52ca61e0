"""A process SIGKILLed between the two renames of a sharded checkpoint's swap (a file system without the
``renameat2`` exchange: NFS, Lustre) loses nothing: ``--resume auto`` takes the new checkpoint it was putting in place.

Every other step of the swap: tests/extras/sharding/unit/test_sharded_swap.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from sharded_swap import resume_and_check

from helpers import cli_env

CHILD = """
import os, signal, sys
from pathlib import Path
from sharded_swap import write
from project.extras.sharding.checkpoints import save as sharded_save

last = Path({last!r})
write(last, step=1)
sharded_save._exchange = lambda first, second: False  # the file system has no renameat2 exchange
rename = os.rename

def rename_or_die(source, target, *args, **kwargs):
    if Path(target) == last and str(source).endswith(".new"):  # between the swap's two renames
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(source, target, *args, **kwargs)

os.rename = rename_or_die
write(last, step=2)
"""


def test_a_process_killed_between_the_two_renames_resumes_from_the_new_checkpoint(tmp_path):
    last = tmp_path / "logs" / "toy" / "version_0" / "checkpoints" / "last.ckpt"
    code = textwrap.dedent(CHILD.format(last=str(last)))
    result = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert not last.exists(), "the kill was not between the renames"
    hidden = sorted(p.name.rpartition(".")[2] for p in last.parent.iterdir())
    assert hidden == ["new", "old"], hidden
    resume_and_check(tmp_path, 2)
