"""``parallel.scenario: zero1`` (configs/sharding/zero1.yaml): DDP with the optimizer state sharded over the ranks.

Five short real runs on CPU over gloo, shared by the tests: one process and two zero1 processes on the same
global batch (AdamW, so the optimizer state matters), and a zero1 run killed at step 15 (its last.ckpt is of
step 10) that is resumed on two processes and on one. No dropout or batch norm: one process and two compute
the same.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch

from helpers import CONFIGS, DIGITS, FAST, cli_env, read_plan, run_cli, two_at_a_time

ZERO1 = str(CONFIGS / "sharding" / "zero1.yaml")
SAME_GLOBAL = [
    "--config", FAST, "--model.init_args.net.init_args.dropout", "0", "--model.init_args.net.init_args.batch_norm",
    "false", "--parallel.global_batch_size", "32", "--trainer.limit_val_batches", "1", "--test_after_fit", "false",
]  # fmt: skip
# 39 steps an epoch at a global batch of 32: the runs cross one epoch end (validation, a best checkpoint, the
# scheduler's step) and the killed run's checkpoint is mid-epoch. A kill, not max_steps: a run that reaches
# max_steps ends its epoch there, and its last save says so.
STEPS, KILL, SAVED = 40, 15, 10
RUN = Path("logs/digits/version_0")


def _weights():
    """The export layer's writer and ``rebuild`` (a test that uses them skips without that layer)."""
    return pytest.importorskip("project.extras.export.weights")


class ShardRecord(L.Callback):
    """Each rank writes down what its optimizer holds after the first step, and its learning rate at the end."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.record: dict = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        """At step 1: the wrapper's type, and the state this rank's local optimizer keeps."""
        if trainer.global_step != 1 or self.record:
            return
        optimizer = trainer.strategy.optimizers[0]
        local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's own optimizer of this rank
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.record = {
            "type": type(optimizer).__name__,
            "local_type": type(local).__name__,
            "parameters": len(params),
            "elements": sum(p.numel() for p in params),
            "local_states": len(local.state),
            "local_elements": sum(p.numel() for p in local.state),
        }

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The rate the local optimizer stepped with last: the scheduler's, if it drives the optimizer that steps."""
        local = getattr(trainer.strategy.optimizers[0], "optim", trainer.strategy.optimizers[0])
        self.record["end_local_lr"] = local.param_groups[0]["lr"]
        self.record["scheduled_lr"] = trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0]
        (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.record))


def fit(cwd: Path, config: str, *extra: str, env: dict[str, str] | None = None, killed: bool = False) -> Path:
    """``fit`` of ``config`` (digits, last.ckpt every 10 steps) in ``cwd``, asserting how it ended; its run folder."""
    result = run_cli(["fit", "--config", config, *extra], cwd, env=env)
    assert (result.returncode != 0) == killed, result.stdout[-2000:] + result.stderr[-3000:]
    return cwd / RUN


def weights(run: Path, name: str = "last.ckpt") -> dict:
    return torch.load(run / "checkpoints" / name, weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """one / zero1: uninterrupted, 1 process and 2 zero1 processes; stopped: zero1 killed at step 15; then resumed
    on 2 zero1 processes (``--ckpt_path last``) and on 1 process (``--resume auto``), each from a copy of it."""
    root = tmp_path_factory.mktemp("zero1")
    text = Path(DIGITS).read_text().replace("every_s: 60\n", "every_s: 60\n        every_n_steps: 10\n")
    assert "every_n_steps: 10" in text, "configs/digits.yaml no longer has TimedCheckpoint(every_s: 60)"
    config = root / "digits_every_10_steps.yaml"
    config.write_text(text)
    cfg = str(config)
    for name in ("one", "zero1", "stopped", "shards"):
        (root / name).mkdir()
    # The recorder is this module: tests/distributed goes on the ranks' PYTHONPATH too.
    env = {"PYTHONPATH": f"{Path(__file__).parent}:{cli_env()['PYTHONPATH']}"}
    more = ["--trainer.max_steps", str(STEPS)]
    record = json.dumps({"class_path": "test_zero1.ShardRecord", "init_args": {"folder": str(root / "shards")}})
    zero1 = ["--config", ZERO1, *SAME_GLOBAL]
    kill = json.dumps({"class_path": "faults.KillAtStep", "init_args": {"step": KILL, "rank": 1}})
    found = dict(
        zip(
            ("one", "stopped"),
            two_at_a_time(
                lambda: fit(root / "one", cfg, *SAME_GLOBAL, *more),
                lambda: fit(root / "stopped", cfg, *zero1, *more, f"--trainer.callbacks+={kill}", killed=True),
            ),
        )
    )
    shutil.copytree(root / "stopped", root / "resumed_two")
    shutil.copytree(root / "stopped", root / "resumed_one")
    found.update(
        zip(
            ("zero1", "resumed_two", "resumed_one"),
            two_at_a_time(
                lambda: fit(root / "zero1", cfg, *zero1, *more, f"--trainer.callbacks+={record}", env=env),
                lambda: fit(root / "resumed_two", cfg, *zero1, *more, "--ckpt_path", "last"),
                lambda: fit(root / "resumed_one", cfg, *SAME_GLOBAL, *more, "--resume", "auto"),
            ),
        )
    )
    found["shards"] = root / "shards"
    return found


def assert_close(got: dict, want: dict, atol: float) -> float:
    """The state dicts match within ``atol`` (and rtol 1e-5); the largest difference."""
    assert got.keys() == want.keys()
    for key in want:
        assert not torch.equal(want[key], torch.zeros_like(want[key])), key
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=atol, msg=key)
    return max((got[key] - want[key]).abs().max().item() for key in want)


def test_zero1_on_two_processes_ends_at_the_weights_of_one_process(runs):
    one, zero1 = weights(runs["one"]), weights(runs["zero1"])
    assert one["global_step"] == zero1["global_step"] == STEPS
    plan = read_plan(runs["zero1"])
    assert plan["strategy"]["name"] == "zero1" and plan["world_size"] == 2 and plan["per_device_batch_size"] == 16
    assert plan["capabilities"]["shards_optimizer_state"] and plan["capabilities"]["checkpoint"] == "file"
    print("max |one - zero1|:", assert_close(zero1["state_dict"], one["state_dict"], atol=1e-5))
    # The checkpoint holds the whole optimizer state, consolidated from both ranks, as one process's does.
    got, want = zero1["optimizer_states"][0], one["optimizer_states"][0]
    assert sorted(got["state"]) == sorted(want["state"]) == list(range(len(zero1["state_dict"])))
    for index, state in want["state"].items():
        assert_close(got["state"][index], state, atol=1e-5)


def test_each_rank_keeps_only_its_part_of_the_optimizer_state(runs):
    records = [json.loads((runs["shards"] / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for record in records:
        assert record["type"] == "ZeroRedundancyOptimizer" and record["local_type"] == "AdamW", record
        assert 0 < record["local_states"] < record["parameters"], record
        # The scheduler stepped once (epoch 0's end) and drives the optimizer that steps: cosine, T_max 20.
        scheduled = 0.003 * (1 + math.cos(math.pi / 20)) / 2
        assert record["end_local_lr"] == pytest.approx(scheduled) == record["scheduled_lr"], record
    # The parts cover every parameter once (whole tensors, dealt largest first to the emptier rank).
    assert sum(r["local_states"] for r in records) == records[0]["parameters"]
    assert sum(r["local_elements"] for r in records) == records[0]["elements"]


def test_a_stopped_zero1_run_resumes_exactly_on_two_processes_and_on_one(runs):
    stopped = weights(runs["stopped"])
    assert stopped["global_step"] == SAVED and len(stopped["optimizer_states"][0]["state"]) > 0
    resumed_two, zero1 = weights(runs["resumed_two"]), weights(runs["zero1"])
    assert resumed_two["global_step"] == STEPS
    assert_close(resumed_two["state_dict"], zero1["state_dict"], atol=1e-6)
    resumed_one, one = weights(runs["resumed_one"]), weights(runs["one"])
    assert resumed_one["global_step"] == STEPS
    assert_close(resumed_one["state_dict"], one["state_dict"], atol=1e-5)


def test_export_is_the_bare_network_of_the_best_checkpoint_as_under_ddp(runs):
    export = runs["zero1"] / "export"
    state = torch.load(export / "model.pt", weights_only=True)
    assert state and not any(k.startswith(("module.", "net.", "_forward_module.")) for k in state)
    (best,) = (runs["zero1"] / "checkpoints").glob("best-*.ckpt")
    want = {k.removeprefix("net."): v for k, v in weights(runs["zero1"], best.name)["state_dict"].items()}
    assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)
    net = _weights().rebuild(export)
    assert all(torch.equal(net.state_dict()[k], want[k]) for k in want)
    assert net(torch.zeros(3, 64)).shape == (3, 10)
