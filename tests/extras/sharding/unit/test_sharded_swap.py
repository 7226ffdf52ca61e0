"""The swap of a sharded checkpoint by renames (no ``renameat2`` exchange: NFS, Lustre) never loses the newest one.

A kill at each step of the swap leaves some state on disk; from every one, ``--resume auto``'s choice
(:func:`~project.checkpoints.resume.choose_checkpoint`) takes the newest complete checkpoint, the run that holds
the lock (:func:`~project.checkpoints.resume.remove_partial_writes`) puts it under its name with nothing hidden
left beside it, and it loads with the weights that were saved. A real SIGKILL of a process between the swap's two
renames: tests/extras/sharding/distributed/test_sharded_swap_kill.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sharded_swap import resume_and_check, write

from project.extras.sharding.checkpoints import save as sharded_save


class Killed(BaseException):
    """The process died here (nothing after it runs, no handler catches it)."""


# The swap's steps in order: commit the complete folder (.new), the old one aside (.old), the new one onto the name,
# the old one removed. A kill before the commit keeps the previous checkpoint; from the commit on, the new one.
STEPS = ("commit", "old aside", "new onto the name", "old removed")


@pytest.mark.parametrize("kill_before", range(len(STEPS) + 1), ids=[*STEPS, "no kill"])
def test_a_kill_at_any_step_of_the_swap_by_renames_resumes_from_the_newest_complete_checkpoint(
    tmp_path, monkeypatch, kill_before
):
    last = tmp_path / "logs" / "toy" / "version_0" / "checkpoints" / "last.ckpt"
    write(last, step=1)
    monkeypatch.setattr(sharded_save, "_exchange", lambda first, second: False)  # NFS: no renameat2 exchange
    replace, rename, remove = sharded_save.replace, sharded_save.os.rename, sharded_save.remove_path
    done: list[tuple] = []

    def step(action):
        def run(*args):
            if len(done) == kill_before:
                raise Killed
            done.append(args)
            return action(*args)

        return run

    def replace_with_steps(source: Path, target: Path) -> None:  # each rename and removal of the swap is a step
        with monkeypatch.context() as inside:
            inside.setattr(sharded_save.os, "rename", step(rename))
            inside.setattr(sharded_save, "remove_path", step(remove))
            replace(source, target)

    monkeypatch.setattr(sharded_save, "replace", replace_with_steps)
    try:
        write(last, step=2)
    except Killed:
        assert kill_before < len(STEPS)
    assert len(done) == kill_before
    monkeypatch.undo()
    resume_and_check(tmp_path, 2 if kill_before > 0 else 1)


def test_a_swap_the_previous_version_left_half_done_is_rolled_back_and_leaves_nothing_hidden(tmp_path):
    """Its two renames: the old checkpoint under `.tmp.old`, the new one uncommitted under `.tmp`, the name empty."""
    last = tmp_path / "logs" / "toy" / "version_0" / "checkpoints" / "last.ckpt"
    write(last, step=1)
    partial = sharded_save.partial_name(last, "legacy")
    last.rename(partial.with_name(f"{partial.name}.old"))
    write(last.with_name("new.ckpt"), step=2)
    last.with_name("new.ckpt").rename(partial)
    resume_and_check(tmp_path, 1)
