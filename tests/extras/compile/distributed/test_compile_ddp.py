"""``parallel.compile: true`` under 2-process DDP, from the command line.

It uses torch.compile's default backend (inductor, what users get): on 2 CPU cores it compiles the small digits
network twice per rank (evaluation in the sanity check, then training), about 20 s with a cold inductor cache and a
few seconds with a warm one (``/tmp/torchinductor_<user>``).
"""

from __future__ import annotations

import pytest
import torch

from project.models.digits_net import DigitsNet

from helpers import CPU_DDP, DIGITS, FAST, read_plan, read_scalars, run_cli, run_dirs


@pytest.mark.distributed
def test_compile_trains_under_two_process_ddp_and_exports_plain_keys(tmp_path):
    args = ["fit", "--config", DIGITS, "--config", FAST, "--config", CPU_DDP, "--parallel.compile", "true"]
    args += ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2"]
    # graph_code: TorchDynamo prints each graph it traces, on each rank (proof that compiled code ran).
    result = run_cli(args, tmp_path, env={"TORCH_LOGS": "graph_code"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "torch.compile: net of Classifier compiled in place after DDPStrategy" in result.stdout
    for rank in (0, 1):
        assert any(f"[rank{rank}]" in line and "TRACED GRAPH" in line for line in output.splitlines()), rank
    (run,) = run_dirs(tmp_path)
    assert read_plan(run)["compile"] is True and read_plan(run)["world_size"] == 2
    assert "test/acc" in read_scalars(run)
    best = next((run / "checkpoints").glob("best-*.ckpt"))
    saved = torch.load(best, weights_only=True)["state_dict"]
    assert not any("_orig_mod" in key or key.startswith("module.") for key in saved)
    exported = torch.load(run / "export" / "model.pt", weights_only=True)
    assert list(exported) == list(DigitsNet().state_dict())  # the bare network's own keys
    for key, value in exported.items():
        assert torch.equal(value, saved[f"net.{key}"]), key  # the export is the best checkpoint's network
