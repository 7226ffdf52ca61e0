"""The benchmark harness cannot rot: its quick mode trains raw, plain Lightning and the template to the same loss."""
# The quick mode's rows: the small MLP on 1 and 2 processes and the layers' (the diabetes layer's regression task);
# every row checks equal work.

from __future__ import annotations

import json
import subprocess
import sys
import time

import lightning as L
import pytest
import torch
import yaml

from helpers import REPO, cli_env

sys.path.insert(0, str(REPO))  # `bench` is a folder of the repository, not an installed package
from bench.commands import command, write_lean_config
from bench.harness import RowResult, Run
from bench.record import OUT_ENV, WINDOW_STEPS, StepClock
from bench.tasks import default_rows
from bench.timing import HookTimer
from bench.workloads import QUICK_SMALL, Row


@pytest.mark.distributed
def test_quick_bench_runs_raw_plain_and_template_to_the_same_loss(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path), "--work", str(tmp_path / "work")],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    data = json.loads((tmp_path / "work" / "results.json").read_text())
    rows = {row["key"]: row for row in data["rows"]}
    assert sorted(rows) == sorted(["small-cpu-1", "small-cpu-2", *(row.key for row in default_rows(True, False))])
    for row in rows.values():
        assert row["equal_work"], row["equal_work_detail"]
        records = [run["record"] for run in row["runs"]]
        assert all(record is not None and record["steps"] == QUICK_SMALL.steps for record in records)
        # Not a timing assertion: the harness really measured something.
        assert all(record["steps_per_s"] > 0 and record["startup_s"] > 0 for record in records)
        assert len({record["final_loss"] for record in records}) == 1
        assert len({record["checksum"] for record in records}) == 1
    assert {run["variant"] for run in rows["small-cpu-1"]["runs"]} == {"raw", "plain", "template"}
    assert {run["variant"] for run in rows["small-cpu-2"]["runs"]} == {"raw", "template"}
    for row in default_rows(True, False):
        assert {run["variant"] for run in rows[row.key]["runs"]} == set(row.variants)
    table = (tmp_path / "results.md").read_text()
    assert "template / raw" in table and "GPU row:" in table
    assert (tmp_path / "results.png").stat().st_size > 0
    assert "equal work" in result.stdout


def _run(variant: str, loss: float, checksum: float = 1.0) -> Run:
    record = {"final_loss": loss, "checksum": checksum, "steps_per_s": 1.0, "startup_s": 1.0}
    return Run(variant, 0, 1.0, record)


def test_equal_work_check_tells_different_losses_and_failures_apart():
    same = RowResult(Row(QUICK_SMALL, 1), [_run("raw", 0.5), _run("plain", 0.5 * (1 + 1e-7)), _run("template", 0.5)])
    assert same.equal_work()[0]
    different = RowResult(Row(QUICK_SMALL, 1), [_run("raw", 0.5), _run("template", 0.51)])
    ok, detail = different.equal_work()
    assert not ok and "final_loss" in detail
    weights = RowResult(Row(QUICK_SMALL, 1), [_run("raw", 0.5, 1.0), _run("template", 0.5, 2.0)])
    assert not weights.equal_work()[0]
    failed = RowResult(Row(QUICK_SMALL, 1), [_run("raw", 0.5), Run("template", 0, 1.0, None, "exit 1: boom")])
    ok, detail = failed.equal_work()
    assert not ok and "boom" in detail


def _clock(step_s: list[float], warmup: int) -> StepClock:
    """A clock whose steps took ``step_s`` seconds each (stamped by hand: no sleeping)."""
    clock = StepClock(warmup, len(step_s))
    now = 0.0
    for seconds in step_s:
        now += seconds
        clock.times.append(now)
    return clock


def test_windowed_rate_counts_periodic_costs_and_outlasts_a_slow_spell():
    # 1 ms steps plus 5 ms every 10th step (the non-finite check's period): each of the 5 windows holds 5 of them.
    steady = [0.001 + (0.005 if step % 10 == 9 else 0.0) for step in range(11 + 5 * WINDOW_STEPS)]
    clock = _clock(steady, warmup=10)
    per_window = WINDOW_STEPS * 0.001 + WINDOW_STEPS // 10 * 0.005
    assert clock.steps_per_s() == pytest.approx(WINDOW_STEPS / per_window)
    assert clock.run_steps_per_s() == pytest.approx(clock.steps_per_s())
    # A 10x slower spell over one window moves the whole-run rate, not the windows' median.
    spell = [s * 10 if 10 + WINDOW_STEPS <= i < 10 + 2 * WINDOW_STEPS else s for i, s in enumerate(steady)]
    slowed = _clock(spell, warmup=10)
    assert slowed.steps_per_s() == pytest.approx(clock.steps_per_s())
    assert slowed.run_steps_per_s() < 0.7 * clock.run_steps_per_s()
    # Fewer steps than one window: the whole run's rate.
    short = _clock([0.002] * 20, warmup=5)
    assert short.steps_per_s() == pytest.approx(500.0)


def test_ratios_pair_the_runs_of_one_repeat():
    def run(variant: str, repeat: int, rate: float) -> Run:
        return Run(variant, repeat, 1.0, {"final_loss": 0.5, "checksum": 1.0, "steps_per_s": rate, "startup_s": 1.0})

    # The machine was twice as fast in repeat 1; within each repeat the template is at 0.9x the floor.
    result = RowResult(
        Row(QUICK_SMALL, 1),
        [run("floor", 0, 100.0), run("template", 0, 90.0), run("floor", 1, 200.0), run("template", 1, 180.0),
         run("floor", 2, 110.0), run("template", 2, 99.0), Run("template", 3, 1.0, None, "exit 1")],
    )  # fmt: skip
    assert result.ratios("template", "floor") == pytest.approx([0.9, 0.9, 0.9])
    assert result.ratio("template", "floor") == pytest.approx(0.9)
    assert result.ratio("template", "raw") is None


def test_a_failed_run_is_run_once_more_and_the_table_says_so(tmp_path, monkeypatch):
    # Only the harness's own bookkeeping: which run is kept, which is listed (the runs are stand-ins).
    import bench.harness as harness
    from bench.report import throughput_table

    calls: list[tuple[str, int]] = []

    def run_once(variant, row, repeat, inputs, work, threads):
        calls.append((variant, repeat))
        if variant == "raw" and calls.count(("raw", repeat)) == 1 and repeat == 0:
            return Run(variant, repeat, 1.0, None, "exit -6: terminate called without an active exception")
        record = {"final_loss": 0.5, "checksum": 1.0, "steps_per_s": 100.0, "startup_s": 1.0}
        return Run(variant, repeat, 1.0, record)

    monkeypatch.setattr(harness, "run_once", run_once)
    monkeypatch.setattr(harness, "prepare_data", lambda workload, work: work / "data.pt")
    monkeypatch.setattr(harness, "write_template_config", lambda workload, work: work / "config.yaml")
    monkeypatch.setattr(harness, "latency_commands", lambda quick: {})
    found = harness.run_all([Row(QUICK_SMALL, 1)], repeats=2, work=tmp_path, log=lambda line: None)
    (result,) = found["rows"]
    assert calls.count(("raw", 0)) == 2 and calls.count(("raw", 1)) == 1
    assert [run.error for run in result.retried] == ["exit -6: terminate called without an active exception"]
    assert all(run.record is not None for run in result.runs) and result.equal_work()[0]
    assert "run again after a failure: raw #1" in throughput_table([result])[-1]


@pytest.mark.parametrize("row", [Row(QUICK_SMALL, 1), *default_rows(True, False)], ids=lambda row: row.key)
def test_ablation_config_drops_only_the_callbacks_that_act_on_every_step(tmp_path, row):
    base = row.workload.base_config
    path, dropped = write_lean_config(tmp_path, base)
    kept = yaml.safe_load(path.read_text())["trainer"]["callbacks"]
    everything = yaml.safe_load((REPO / base).read_text())["trainer"]["callbacks"]
    listed = [d for d in dropped if "guards layer" not in d]  # the guards layer's check is off by its own section
    assert len(kept) + len(listed) == len(everything) and listed
    assert not any(c["class_path"].endswith(("TimedCheckpoint", "NonFiniteLossCallback")) for c in kept)
    args = command("lean", row, tmp_path / "data.pt", tmp_path / "quick.yaml")
    assert args[-3:] == ["--config", str(path), "--trainer.callbacks+=bench.timing.StepTimer"]
    assert str(REPO / base) in args


class Busy(L.Callback):
    """A callback whose per-step hook takes a known minimum time."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(0.002)


class Logs(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_hook_timer_times_each_callback_and_the_modules_logging_in_the_run(tmp_path, monkeypatch):
    record = tmp_path / "record.json"
    monkeypatch.setenv(OUT_ENV, str(record))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4)
    trainer = L.Trainer(
        max_steps=12, callbacks=[Busy(), HookTimer(warmup=2)], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Logs(), data)
    written = json.loads(record.read_text())
    assert written["hooks_us"]["Busy"] >= 2000  # the sleep, per measured step
    assert 0 < written["hooks_us"]["Logs: self.log"] < written["hooks_us"]["Busy"]
    assert written["dispatch_us"]["Busy"] > 0 and "HookTimer" not in written["dispatch_us"]


def test_workloads_of_one_name_never_share_a_config_or_data_file(tmp_path):
    from dataclasses import replace

    from bench.commands import prepare_data, write_template_config

    other = replace(QUICK_SMALL, max_processes=4)  # as the small MLP's 4-process row: more data
    assert write_template_config(QUICK_SMALL, tmp_path) != write_template_config(other, tmp_path)
    assert prepare_data(QUICK_SMALL, tmp_path) != prepare_data(other, tmp_path)
