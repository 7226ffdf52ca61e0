"""``parallel.tensor_parallel``: the digits MLP split over processes ends at the weights of one process.

Real runs on CPU over gloo, shared by the tests: one process; tensor parallel 2 on 2 processes (dp 1 x tp 2);
a tensor-parallel run killed at step 15 (its last.ckpt, a sharded folder, is of step 10) resumed as plain DDP on
2 processes (dp 2 x tp 1), and a DDP run killed alike (a plain file) resumed as tensor parallel; the sharded
checkpoint merged into one file by ``consolidate``. All in float64 (``parallel.precision: 64``): sums reordered by
the split agree to 1e-9, so any real difference shows; and one float32 pair for the template's usual 1e-5 bound.
No dropout or batch norm: one process and the splits compute the same. 2-D (FSDP x TP on 4 processes) is checked on
the GPT: test_gpt_tensor_parallel.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import CPU_DDP, DIGITS, FAST, assert_clean_error, every_10_steps, run_cli, run_dirs, two_at_a_time

SAME = [
    "--config", FAST, "--model.init_args.net.init_args.dropout", "0", "--model.init_args.net.init_args.batch_norm",
    "false", "--parallel.global_batch_size", "32", "--trainer.limit_val_batches", "1", "--test_after_fit", "false",
    "--trainer.max_steps", "20",
]  # fmt: skip
F64 = ["--parallel.precision", "64"]
TP2 = ["--config", CPU_DDP, "--parallel.tensor_parallel.size", "2"]
RUN = Path("logs/digits/version_0")


def fit(cwd: Path, *extra: str, config: str = DIGITS, killed: bool = False) -> Path:
    """``fit`` of ``config`` in ``cwd``, asserting how it ended; its run folder."""
    cwd.mkdir(parents=True, exist_ok=True)
    result = run_cli(["fit", "--config", config, *SAME, *extra], cwd)
    assert (result.returncode != 0) == killed, result.stdout[-2000:] + result.stderr[-3000:]
    return cwd / RUN


def exported(run: Path) -> dict[str, torch.Tensor]:
    """The run's exported weights (full tensors, gathered from the shards)."""
    return torch.load(run / "export" / "model.pt", weights_only=True)


def worst_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference of any tensor, relative to that tensor's largest value."""
    assert a.keys() == b.keys()
    return max(((a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max()).item() for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp")
    kill = json.dumps({"class_path": "faults.KillAtStep", "init_args": {"step": 15, "rank": 1}})
    one64, one32, tp64, tp32 = two_at_a_time(
        lambda: fit(root / "one64", *F64),
        lambda: fit(root / "one32"),
        lambda: fit(root / "tp64", *TP2, *F64),
        lambda: fit(root / "tp32", *TP2),
    )
    steps, ddp = every_10_steps(), ["--config", CPU_DDP]
    two_at_a_time(
        lambda: fit(root / "to_ddp", *TP2, *F64, f"--trainer.callbacks+={kill}", config=steps, killed=True),
        lambda: fit(root / "to_tp", *ddp, *F64, f"--trainer.callbacks+={kill}", config=steps, killed=True),
    )
    to_ddp, to_tp = two_at_a_time(
        lambda: fit(root / "to_ddp", *ddp, *F64, "--resume", "auto", config=steps),
        lambda: fit(root / "to_tp", *TP2, *F64, "--resume", "auto", config=steps),
    )
    return {"one64": one64, "one32": one32, "tp64": tp64, "tp32": tp32, "to_ddp": to_ddp, "to_tp": to_tp}


def test_tensor_parallel_on_two_processes_ends_at_the_weights_of_one_process(runs):
    plan = json.loads((runs["tp64"] / "plan.json").read_text())
    assert plan["degrees"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 2, "dp": 1}
    assert plan["strategy"]["name"] == "tensor_parallel"
    assert worst_relative(exported(runs["tp64"]), exported(runs["one64"])) < 1e-9
    assert worst_relative(exported(runs["tp32"]), exported(runs["one32"])) < 1e-5
    assert exported(runs["tp64"])["layers.0.weight"].dtype == torch.float64


def test_a_tensor_parallel_checkpoint_consolidates_into_one_file_of_the_weights_one_process_trained(runs, tmp_path):
    folder = runs["tp64"] / "checkpoints" / "last.ckpt"
    assert folder.is_dir()  # sharded: each rank wrote its half of every split layer
    out = tmp_path / "merged.ckpt"
    result = run_cli(["consolidate", str(folder), "--out", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    merged = torch.load(out, weights_only=True)
    one = torch.load(runs["one64"] / "checkpoints" / "last.ckpt", weights_only=True)
    assert merged["global_step"] == one["global_step"] == 20
    nets = [{k: v for k, v in c["state_dict"].items() if k.startswith("net.")} for c in (merged, one)]
    assert worst_relative(*nets) < 1e-9


@pytest.mark.parametrize(("run", "tp"), [("to_ddp", 1), ("to_tp", 2)])
def test_a_checkpoint_resumes_on_the_other_layout_at_the_same_weights(runs, run, tp):
    plan = json.loads((runs[run] / "plan.json").read_text())
    assert plan["degrees"]["tp"] == tp and plan["world_size"] == 2
    assert worst_relative(exported(runs[run]), exported(runs["one64"])) < 1e-9


def test_user_modules_split_by_their_own_plan_or_their_own_parallelize_method(tmp_path):
    """A network ``auto`` cannot read, split by name patterns; one that splits itself. Both train through the CLI."""
    base = ["fit", "--config", DIGITS, "--config", FAST, "--config", CPU_DDP, "--trainer.max_steps", "4"]
    base += ["--parallel.tensor_parallel.size", "2", "--test_after_fit", "false", "--trainer.limit_val_batches", "1"]
    plans = {
        "PatternClassifier": ["--parallel.tensor_parallel.plan", '{"net.body": colwise, "net.head": rowwise}'],
        "SplitsItself": [],
    }

    def fit(name: str):
        (tmp_path / name).mkdir()
        return run_cli([*base, "--model", f"user_nets.{name}", *plans[name]], tmp_path / name)

    for name, result in zip(plans, two_at_a_time(*(lambda n=n: fit(n) for n in plans))):
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        (run,) = run_dirs(tmp_path / name)
        modules = json.loads((run / "plan.json").read_text())["runtime"]["tensor_parallel"]
        expected = (
            {"net.body": "colwise", "net.head": "rowwise"} if name == "PatternClassifier" else {"": "parallelize(mesh)"}
        )
        assert modules == expected
        assert (run / "export" / "model.pt").is_file()


def test_a_plan_that_cannot_apply_is_one_line_from_the_cli(tmp_path):
    base = ["--config", DIGITS, "--config", CPU_DDP, "--parallel.tensor_parallel.size", "2"]
    nothing = run_cli(["plan", *base, "--parallel.tensor_parallel.plan", '{"net.nope*": colwise}'], tmp_path)
    assert_clean_error(nothing, "matches no module")
    uneven = run_cli(["plan", *base, "--parallel.tensor_parallel.size", "3"], tmp_path)
    assert_clean_error(uneven, "does not divide the world size 2")
