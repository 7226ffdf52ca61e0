"""The core's one interface to where a run directory lives: the local disk by default, a layer's store for URLs.

The local disk answers every question with the path itself or nothing (what the core did before stores); a URL is
served by the store an installed layer registers for its scheme (``Layer.run_stores``), and a URL no layer serves
is refused in one line before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonargparse import Namespace

from project import run_store
from project.errors import UserError
from project.run_store import LOCAL, RunStore


@pytest.fixture(autouse=True)
def local_again(monkeypatch):
    monkeypatch.setattr(run_store, "_active", LOCAL)


def config(save_dir: str, **options) -> Namespace:
    logger = Namespace(class_path="TensorBoardLogger", init_args=Namespace(save_dir=save_dir, name="digits"))
    return Namespace(trainer=Namespace(logger=logger), **{"ckpt_path": None, "resume": None, **options})


class Recording(RunStore):
    """A store for ``mem://`` URLs that notes what the core asked of it."""

    schemes = ("mem",)

    def __init__(self, scratch: Path) -> None:
        self.scratch, self.calls = scratch, []

    def configure(self, config) -> None:
        self.calls.append("configure")

    def attach(self, url: str) -> Path:
        self.calls.append(("attach", url))
        return self.scratch

    def pull(self, name_root: Path, version: str | None) -> None:
        self.calls.append(("pull", name_root, version))


def test_the_local_disk_answers_with_the_path_itself_or_nothing(tmp_path):
    path = tmp_path / "last.ckpt"
    finished = []
    assert LOCAL.reserve(tmp_path, 3) is None and LOCAL.hold(tmp_path, True) is None
    assert LOCAL.committed(path) and LOCAL.local_copy(str(path)) == str(path) and LOCAL.shown(path) == str(path)
    LOCAL.commit_sharded(tmp_path / ".partial", path, "t", b"meta", None, lambda *args: finished.append(args))
    LOCAL.commit_sharded(tmp_path / ".partial", path, "t", None, None, lambda *args: finished.append(args))
    assert finished == [(tmp_path / ".partial", path, b"meta")]  # rank 0 alone puts the folder in place


def test_a_local_save_dir_keeps_the_local_disk(monkeypatch):
    monkeypatch.setattr(run_store, "layer_stores", lambda: ())
    parsed = config("logs")
    assert run_store.open_run(parsed) is LOCAL and parsed.trainer.logger.init_args.save_dir == "logs"


@pytest.mark.parametrize("where", ["save_dir", "ckpt_path"])
def test_a_url_no_layer_serves_is_refused_in_one_line(monkeypatch, where):
    monkeypatch.setattr(run_store, "layer_stores", lambda: ())
    parsed = config("s3://b/p") if where == "save_dir" else config("logs")
    if where == "ckpt_path":
        parsed.ckpt_path = "s3://b/p/digits/version_0/checkpoints/last.ckpt"
    with pytest.raises(UserError) as refused:
        run_store.open_run(parsed)
    message = str(refused.value)
    assert "\n" not in message and "s3://b/p" in message
    assert "needs the storage layer (project/extras/storage), which this checkout does not have" in message


def test_a_layers_store_serves_its_scheme_and_the_run_writes_into_its_cache(monkeypatch, tmp_path):
    store = Recording(tmp_path / "cache")
    monkeypatch.setattr(run_store, "layer_stores", lambda: (store,))
    parsed = config("mem://bucket/runs", resume="auto")
    assert run_store.open_run(parsed) is store and run_store.active() is store
    assert parsed.trainer.logger.init_args.save_dir == str(tmp_path / "cache")
    assert store.calls == ["configure", ("attach", "mem://bucket/runs"), ("pull", tmp_path / "cache/digits", None)]
    with pytest.raises(UserError, match="s3://other needs the storage layer"):
        run_store.store_for("s3://other", "--ckpt_path")
