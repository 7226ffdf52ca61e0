"""Nothing a user trained is lost: a finished run is never removed or overwritten, runs never share a folder,
damaged checkpoints are never loaded, and a shared export runs no code but a network's.

Each CLI case checks the run's files by content hash before and after.
"""

from __future__ import annotations

import json
import multiprocessing
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from project.checkpoints.background import BackgroundCheckpointIO, CheckpointWriteError
from project.checkpoints.loading import safe_load
from project.checkpoints.resume import RunName, find_resume_checkpoint
from project.errors import UserError

from helpers import DIGITS, FAST, assert_clean_error, file_hashes, run_cli, run_dirs, two_at_a_time

SHORT = ["--config", DIGITS, "--config", FAST, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3"]
SHORT += ["--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """A folder with run A (fit, then resumed by `--resume auto`) and run B (a later fit of the same name)."""
    cwd = tmp_path_factory.mktemp("two_runs")
    first = run_cli(["fit", *SHORT, "--test_after_fit", "false"], cwd)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli(
        ["fit", *SHORT, "--trainer.max_epochs", "2", "--resume", "auto", "--test_after_fit", "false"], cwd
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from" in resumed.stderr, resumed.stderr[-2000:]
    second = run_cli(["fit", *SHORT, "--test_after_fit", "false"], cwd)
    assert second.returncode == 0, second.stderr[-3000:]
    assert [p.name for p in run_dirs(cwd)] == ["version_0", "version_1"]
    return cwd


def test_a_runs_config_starts_new_runs_and_means_that_run(two_runs, tmp_path):
    """After --resume auto, config.yaml pins no version: fit/validate with it never touch run A's files."""
    run_a = two_runs / "logs" / "digits" / "version_0"
    assert "version: version_0" not in (run_a / "config.yaml").read_text()
    before = file_hashes(run_a)
    config = ["--config", str(run_a / "config.yaml"), "--trainer.limit_val_batches", "2"]
    refit, validated = two_at_a_time(
        lambda: run_cli(["fit", *config, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2"], two_runs),
        lambda: run_cli(["validate", *config, "--ckpt_path", "last"], two_runs),
    )
    assert refit.returncode == 0, refit.stderr[-3000:]
    assert validated.returncode == 0, validated.stderr[-3000:]
    # `last` with run A's config is run A's checkpoint, although run B is newer.
    assert f"{run_a}/checkpoints/last.ckpt" in validated.stdout + validated.stderr
    assert file_hashes(run_a) == before
    assert len(run_dirs(two_runs)) == 4  # the fit and the validate each got their own new version


def test_two_fits_started_at_once_get_their_own_run_directories(tmp_path):
    """Two fits of one run name, started side by side in one folder: version_0 and version_1, one run each."""
    args = ["fit", *SHORT, "--trainer.max_steps", "2", "--test_after_fit", "false"]
    results = two_at_a_time(lambda: run_cli(args, tmp_path), lambda: run_cli(args, tmp_path))
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    runs = run_dirs(tmp_path)
    assert [run.name for run in runs] == ["version_0", "version_1"]
    for run in runs:
        assert len(list(run.glob("events.out.tfevents.*"))) == 1
        assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "config.yaml").is_file()


def test_a_failure_after_training_keeps_every_file(tmp_path):
    """The after-fit test fails: one line naming the step and the kept folder, exit 2, the run's files all there."""
    args = ["fit", *SHORT, "--trainer.callbacks+=user_shapes.FailingTestCallback"]
    result = run_cli(args, tmp_path)
    assert_clean_error(result, "training reached step 3", "everything it wrote is kept", "raised on purpose")
    assert result.returncode == 2
    (run,) = run_dirs(tmp_path)
    kept = file_hashes(run)
    assert "checkpoints/last.ckpt" in kept and "export/model.pt" in kept and "config.yaml" in kept
    assert any(name.startswith("events.out") for name in kept)


def test_a_module_without_test_step_fits_without_the_after_fit_test(tmp_path):
    """A module without test_step: fit ends with exit 0 and one line saying the test was skipped."""
    args = ["fit", *SHORT, "--model", "user_shapes.NoTestStepModule"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "No test after fit: NoTestStepModule has no test_step" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def _reserve(args: tuple[str, int]) -> str:
    from lightning.pytorch.loggers import TensorBoardLogger

    from project.runs import reserve_run_directory

    save_dir, _ = args
    return str(reserve_run_directory(TensorBoardLogger(save_dir, name="digits")))


def test_runs_started_at_once_get_distinct_folders(tmp_path):
    """Eight processes reserve a run folder of one name at the same moment: eight distinct folders."""
    (tmp_path / "logs" / "digits" / "version_0").mkdir(parents=True)  # an earlier run
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        folders = pool.map(_reserve, [(str(tmp_path / "logs"), i) for i in range(8)])
    assert len(set(folders)) == 8
    assert sorted(Path(f).name for f in folders) == [f"version_{i}" for i in range(1, 9)]


def test_a_removal_behind_a_failed_save_does_not_run(tmp_path):
    """Disk full (here: a save that cannot be written): the previous best, queued for removal behind it, stays."""
    previous = tmp_path / "best-1.ckpt"
    torch.save({"state_dict": {}}, previous)
    io = BackgroundCheckpointIO()
    blocked = tmp_path / "not_a_folder"
    blocked.write_text("a file where the checkpoint folder should be")
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, blocked / "best-2.ckpt")
    io.remove_checkpoint(previous)
    with pytest.raises(CheckpointWriteError, match="is intact"):
        io.teardown()
    assert previous.is_file()
    # and a removal behind a save that succeeded does run
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, tmp_path / "best-3.ckpt")
    io.remove_checkpoint(previous)
    io.teardown()
    assert not previous.exists()


def _flip(path: Path, member_suffix: str, count: int) -> None:
    """Overwrite ``count`` bytes in the middle of the zip member whose name ends with ``member_suffix``."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(member_suffix))
    data = bytearray(path.read_bytes())
    # The member's data starts after its local header, whose name and extra field lengths are at bytes 26-29.
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_length + extra_length + info.file_size // 2
    data[start : start + count] = bytes(b ^ 0xFF for b in data[start : start + count])
    path.write_bytes(bytes(data))


def _training_checkpoint(path: Path, seed: int) -> None:
    torch.manual_seed(seed)
    net = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(net.parameters())
    net(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"state_dict": net.state_dict(), "optimizer_states": [optimizer.state_dict()], "loops": {}}
    torch.save({**state, "global_step": seed, "epoch": 0}, path)


@pytest.mark.parametrize(("member", "count"), [("data/0", 4096), ("data/2", 16)])
def test_bit_flipped_checkpoints_are_skipped_by_resume_and_refused_when_named(tmp_path, member, count):
    """Weights (4 KB flipped) or an AdamW moment (16 bytes): the zip's CRC32 names the damage; nothing loads it."""
    checkpoints = tmp_path / "logs" / "digits" / "version_0" / "checkpoints"
    _training_checkpoint(checkpoints / "epoch0.ckpt", seed=1)
    _training_checkpoint(checkpoints / "last.ckpt", seed=2)
    _flip(checkpoints / "last.ckpt", member, count)
    with pytest.raises(UserError, match=r"fails its CRC32 check"):
        safe_load(checkpoints / "last.ckpt")
    found = find_resume_checkpoint(RunName(tmp_path / "logs" / "digits"))
    assert found is not None and found[0].name == "epoch0.ckpt"


def test_a_damaged_checkpoint_named_on_the_command_line_is_one_line(two_runs, tmp_path):
    """`test --ckpt_path <damaged file>`: exit 2, one line naming the file and the damage; nothing written."""
    damaged = tmp_path / "damaged.ckpt"
    damaged.write_bytes((two_runs / "logs" / "digits" / "version_1" / "checkpoints" / "last.ckpt").read_bytes())
    _flip(damaged, "data/0", 64)
    result = run_cli(["test", *SHORT, "--ckpt_path", str(damaged)], tmp_path)
    assert_clean_error(result, "damaged.ckpt", "fails its CRC32 check")
    assert result.returncode == 2
    assert not (tmp_path / "logs").exists()


def _called(marker: str) -> None:
    Path(marker).write_text("called")


def test_an_export_naming_anything_but_a_network_is_refused_and_runs_nothing(tmp_path):
    """model.json naming a function, or subprocess.Popen: one line, nothing called."""
    pytest.importorskip("project.extras.export")  # export/ and rebuild are the export layer's
    from project.extras.export.weights import export_network, rebuild

    folder = tmp_path / "export"
    spec_of_linear = {"class_path": "torch.nn.Linear", "init_args": {"in_features": 3, "out_features": 2}}
    export_network(torch.nn.Linear(3, 2), folder, spec_of_linear)
    assert isinstance(rebuild(folder), torch.nn.Linear)
    spec = folder / "model.json"
    marker = tmp_path / "marker"
    for class_path, init_args in (
        ("test_nothing_lost._called", {"marker": str(marker)}),
        ("subprocess.Popen", {"args": ["touch", str(marker)]}),
    ):
        spec.write_text(json.dumps({"class_path": class_path, "init_args": init_args}))
        with pytest.raises(UserError, match=r"not an nn\.Module subclass"):
            rebuild(folder, trusted=["test_nothing_lost", "subprocess"])  # trusted modules: still only a network
    assert not marker.exists()


def test_the_cli_reserves_the_run_directory_before_lightning_lists_the_folders(tmp_path, monkeypatch):
    """The guard of a run creates version_<n> itself (mkdir), so Lightning never picks a version by listing."""
    from project.build import ProjectCLI
    from project.run_guard import RunDirectoryGuard

    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs" / "digits" / "version_0").mkdir(parents=True)
    cli = ProjectCLI("fit", ["--config", DIGITS, "--config", FAST])
    guard = RunDirectoryGuard.of(cli.trainer, continuing=False)
    assert guard.run_dir == Path("logs/digits/version_1") and guard.run_dir.is_dir()
    assert cli.trainer.logger.version == 1
    guard.undo()  # refused before training: the reserved folder goes again
    assert not guard.run_dir.exists() and (tmp_path / "logs" / "digits" / "version_0").is_dir()
