"""``micro_batch: auto`` on 1, 2 and 4 processes: the picked size fits every rank and changes nothing but speed.

Each rank capped by :class:`memory_probe.AddressSpaceLimit` (``RLIMIT_AS``: the CPU's real out-of-memory error)
during the search, on one rank only or on all: the run picks a micro-batch smaller than a whole step on every rank
(one rank out of memory never hangs the others), records it in ``plan.json``, and ends within 1e-5 of a run with a
fixed micro-batch of the same global batch (:class:`memory_probe.BroadNet` has no BatchNorm).
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers import CPU_DDP, DIGITS, FAST, read_plan, run_cli, run_dirs, two_at_a_time

GLOBAL = 128
FIT = [
    "fit",
    *("--config", DIGITS, "--config", FAST),
    *("--model.init_args.net", "memory_probe.BroadNet", "--model.init_args.net.init_args.hidden", "64"),
    *("--parallel.global_batch_size", str(GLOBAL), "--trainer.max_steps", "4", "--test_after_fit", "false"),
    *("--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0"),
]
CAP = "--trainer.callbacks+=memory_probe.AddressSpaceLimit"


def fit(cwd, processes: int, *extra: str):
    cwd.mkdir(parents=True, exist_ok=True)
    layout = ["--config", CPU_DDP, "--parallel.devices", str(processes)] if processes > 1 else []
    result = run_cli([*FIT, *layout, *extra], cwd, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(cwd)
    return run, result


def weights(run) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 4
    return checkpoint["state_dict"]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """One process, the whole global batch in one micro-batch (no cap)."""
    run, _ = fit(tmp_path_factory.mktemp("fixed"), 1, "--parallel.micro_batch", str(GLOBAL))
    assert read_plan(run)["accumulation"] == 1
    return weights(run)


def capped(processes: int, headroom_mb: int, ranks: list[int] | None):
    cap = [CAP, "--trainer.callbacks.init_args.headroom_mb", str(headroom_mb)]
    if ranks is not None:
        cap += ["--trainer.callbacks.init_args.ranks", json.dumps(ranks)]
    return lambda cwd: fit(cwd, processes, "--parallel.micro_batch", "auto", *cap)


@pytest.mark.distributed
def test_auto_under_a_memory_cap_on_one_rank_or_all_picks_one_smaller_size_and_ends_at_the_same_weights(
    tmp_path, fixed
):
    cases = {
        "1-process": (1, capped(1, 100, None)),
        "2-processes-rank-1-capped": (2, capped(2, 100, [1])),
        "2-processes-all-capped": (2, capped(2, 100, None)),
        "4-processes-rank-2-capped": (4, capped(4, 85, [2])),
    }
    results = two_at_a_time(*(lambda name=name, run=run: run(tmp_path / name) for name, (_, run) in cases.items()))
    for (name, (processes, _)), (run, result) in zip(cases.items(), results):
        plan = read_plan(run)
        step = GLOBAL // processes  # samples per process and optimizer step
        trials = plan["micro_batch_trials"]
        assert trials[0] == [step, False] and trials[-1][1] is True, (name, trials)
        picked = plan["micro_batch"]
        assert picked == trials[-1][0] < step and plan["per_device_batch_size"] == picked, (name, plan)
        assert plan["accumulation"] == step // picked and plan["global_batch_size"] == GLOBAL, (name, plan)
        assert f"micro-batch auto picked {picked} per process" in result.stderr, name
        got = weights(run)
        for key, value in fixed.items():
            assert torch.allclose(got[key], value, rtol=0, atol=1e-5), (name, key, (got[key] - value).abs().max())


@pytest.mark.distributed
@pytest.mark.parametrize("processes", [1, 2])
def test_a_spike_in_mid_run_on_one_rank_is_done_again_finer_by_every_rank_and_ends_at_the_same_weights(
    tmp_path, fixed, processes
):
    # The last rank runs out of memory from its third training forward on, in micro-batches of over 16 samples:
    # the search (1 forward) and step 0 fit whole steps; step 1 is done again in halves, down to 16 per process.
    spike = ["--model.init_args.net", "memory_probe.SpikyNet", "--model.init_args.net.init_args.hidden", "64"]
    spike += ["--model.init_args.net.init_args.rank", str(processes - 1)]
    run, result = fit(tmp_path, processes, "--parallel.micro_batch", "auto", *spike)
    step = GLOBAL // processes
    plan = read_plan(run)
    assert plan["micro_batch"] == step and plan["micro_batch_trials"] == [[step, True]], plan
    said = [line for line in result.stderr.splitlines() if "ran out of memory on a rank in micro-batches" in line]
    drops = {1: 3, 2: 2}[processes]  # 128 -> 64 -> 32 -> 16, or 64 -> 32 -> 16
    assert len(said) == drops, result.stderr[-3000:]
    assert said[-1].endswith(f"micro-batches of 16 (accumulation {step // 16}), which changes no result"), said
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    (state,) = [v for k, v in checkpoint["callbacks"].items() if k.startswith("MicroBatchSearch")]
    assert state["micro_batch"] == 16 and [drop[0] for drop in state["split_finer"]] == [1] * drops, state
    got = weights(run)
    for key, value in fixed.items():
        assert torch.allclose(got[key], value, rtol=0, atol=1e-5), (key, (got[key] - value).abs().max())
