"""scenario fsdp: FSDP2 over CPU processes (gloo), sharded checkpoints, consolidate, and every refusal.

The distributed runs share one configuration without batch-coupled layers (no BatchNorm, no dropout), a global
batch of 32 and a validation split of 129 samples, so that the two ranks' exactly-once shards (65 and 64) have
different numbers of batches, which FSDP's per-forward all-gather must survive:

- ``fsdp``: 2 processes, one epoch, then test of the best checkpoint and the export;
- ``ddp``: the same on DDP, for the weights;
- ``killed``: the fsdp run, rank 0 SIGKILLed when the checkpoint of step 20 is written but not yet renamed;
  then resumed on 2 processes (sharded) and, from a copy, on 1 (merged): both end at ``fsdp``'s weights and
  report its validation metrics;
- hybrid sharding on two "machines" of one process each, with gradient accumulation.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace
from torch import nn

from project.checkpoints.resume import RunName, choose_checkpoint, find_resume_checkpoint, remove_partial_writes
from project.errors import UserError
from project.extras.sharding import checkpoints as sharded
from project.extras.sharding.checkpoints import merge as sharded_merge
from project.extras.sharding.checkpoints import save as sharded_save
from project.extras.sharding.consolidate import consolidate
from project.extras.sharding.fsdp.units import default_wrap_classes, plan_units, resolve_wrap_classes, sharded_roots
from project.models.classifier import Classifier
from project.models.digits_net import DigitsNet
from project.plan.environment import LaunchEnvironment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

from helpers import (
    CONFIGS,
    CPU_DDP,
    DIGITS,
    FAST,
    assert_clean_error,
    cli_env,
    every_10_steps,
    free_port,
    read_plan,
    read_scalars,
    run_cli,
    run_dirs,
)

CPU_FSDP = str(CONFIGS / "sharding" / "cpu_fsdp.yaml")
GPU_FSDP = str(CONFIGS / "sharding" / "fsdp.yaml")
LOCAL = LaunchEnvironment(launcher="lightning", external=False)
VAL_FRACTION = "0.072"  # 1398 / 129 / 270 samples: 43 steps of 32, validation shards of 65 and 64
COMMON = [
    "--config",
    FAST,
    "--model.init_args.net.init_args.dropout",
    "0",
    "--model.init_args.net.init_args.batch_norm",
    "false",
    "--parallel.global_batch_size",
    "32",
    "--data.init_args.val_fraction",
    VAL_FRACTION,
    "--trainer.max_epochs",
    "1",
]


def fit(cwd: Path, layout: str, *extra: str, config: str | None = None) -> subprocess.CompletedProcess[str]:
    """``fit`` of the shared configuration (``last.ckpt`` every 10 steps) on ``layout``, in ``cwd``."""
    return run_cli(["fit", "--config", config or every_10_steps(), "--config", layout, *COMMON, *extra], cwd)


def said(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stdout + result.stderr)[-4000:]


def weights(path: Path) -> dict[str, torch.Tensor]:
    """The LightningModule weights of a checkpoint file or a sharded folder (merged)."""
    return sharded_merge.checkpoint_weights(path)


def assert_close_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5, msg=key)  # the issue: within 1e-5


# --------------------------------------------------------------------------------------------- the plan
def plan(gpus: int, **fields):
    return resolve_plan(ParallelConfig(**fields), Hardware(gpus), LOCAL, 64)


def test_fsdp_plans_its_sharding_on_gpus_and_on_cpu_processes():
    full = plan(8, scenario="fsdp")
    assert (full.strategy, full.backend, full.world_size) == ("fsdp", "nccl", 8)
    assert (full.layout.dp_replicate, full.layout.dp_shard, full.layout.tp) == (1, 8, 1) and full.dp_size == 8
    assert full.strategy_args["fsdp"]["sharding"] == "full" and full.strategy_args["reshard_after_forward"] is True
    grad_op = plan(8, scenario="fsdp", fsdp={"sharding": "grad_op", "cpu_offload": True, "wrap_modules": ["Linear"]})
    assert grad_op.strategy_args["reshard_after_forward"] is False
    assert grad_op.strategy_args["fsdp"]["cpu_offload"] is True
    assert grad_op.strategy_args["fsdp"]["wrap_modules"] == ["Linear"]
    hybrid = plan(8, scenario="fsdp", fsdp={"sharding": "hybrid"}, num_nodes=2)
    assert hybrid.world_size == 16 and (hybrid.layout.dp_replicate, hybrid.layout.dp_shard) == (2, 8)
    assert any("within each node (8 processes), replicated across 2 nodes" in note for note in hybrid.notes)
    cpu = plan(0, scenario="fsdp", devices=2)
    assert (cpu.accelerator, cpu.backend, cpu.devices, cpu.strategy) == ("cpu", "gloo", 2, "fsdp")
    one = plan(0, scenario="fsdp")
    assert one.strategy == "single_device" and any("nothing to shard" in note for note in one.notes)
    # Batch math as under ddp: the data batch is per device.
    assert (full.per_device_batch_size, full.global_batch_size) == (64, 512)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        (
            {"scenario": "ddp", "fsdp": {"sharding": "grad_op"}},
            "parallel.fsdp.sharding='grad_op' applies to scenario fsdp only",
        ),
        (
            {"scenario": "cpu", "fsdp": {"cpu_offload": True}},
            "parallel.fsdp.cpu_offload=True applies to scenario fsdp only",
        ),
        ({"fsdp": {"wrap_modules": ["Linear"]}}, "parallel.fsdp.wrap_modules=['Linear'] applies to scenario fsdp only"),
        ({"scenario": "fsdp", "fsdp": {"sharding": "hybrid"}}, "but num_nodes=1; use sharding full"),
    ],
)
def test_fsdp_fields_that_cannot_apply_are_one_line(fields, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        plan(8, **fields)


def test_plan_for_8_gpus_shows_fsdp_sharding_and_units(tmp_path):
    result = run_cli(["plan", "--config", DIGITS, "--config", GPU_FSDP, "--assume_gpus", "8", "--json"], tmp_path)
    assert result.returncode == 0, said(result)
    data = json.loads(result.stdout.strip().splitlines()[-1])
    strategy = data["strategy"]
    assert strategy["name"] == "fsdp" and strategy["fsdp"]["sharding"] == "full"
    assert strategy["fsdp"]["cpu_offload"] is False
    assert strategy["units"] == {"roots": ["net"], "classes": ["Linear", "BatchNorm1d"], "units": 5}
    assert data["degrees"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 8, "tp": 1, "dp": 8}
    assert data["backend"] == "nccl"
    # plan refuses, at any world size (fit on several processes, before training): a class the networks lack.
    with pytest.raises(UserError, match=re.escape("'Conv2d', but Classifier's networks have no module of that class")):
        plan_units(plan(0, scenario="fsdp", devices=1), Classifier(DigitsNet()), ["Conv2d"])


def test_fit_refuses_an_unknown_unit_class_before_anything_is_written(tmp_path):
    args = ["fit", "--config", DIGITS, "--config", CPU_FSDP, "--parallel.fsdp.wrap_modules=[Conv2d]"]
    result = run_cli(args, tmp_path)
    assert_clean_error(result, "error: parallel.fsdp.wrap_modules lists 'Conv2d'", "(they have: BatchNorm1d, DigitsNet")
    assert result.returncode == 2 and not (tmp_path / "logs").exists()


# ------------------------------------------------------------------------------------------- the units
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.inner(x))


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(2, 4)
        self.blocks = nn.ModuleList([Block(), Block(), Block()])
        self.head = nn.Linear(4, 1)


def test_the_default_units_are_the_outermost_repeated_modules():
    # A transformer-like stack: its blocks (not the Linear layers inside them); the lone layers join the root.
    assert default_wrap_classes([Tower()]) == [Block]
    assert default_wrap_classes([DigitsNet(batch_norm=False, dropout=0)]) == [nn.Linear]
    classifier = Classifier(DigitsNet())
    assert [name for name, _ in sharded_roots(classifier)] == ["net"]
    assert resolve_wrap_classes(classifier, ["project.models.digits_net.DigitsNet", "BatchNorm1d"]) == [
        DigitsNet,
        nn.BatchNorm1d,
    ]


def test_parameters_held_by_the_lightning_module_itself_are_refused():
    classifier = Classifier(DigitsNet())
    classifier.scale = nn.Parameter(torch.ones(1))
    with pytest.raises(UserError, match=r"holds the parameter\(s\) scale itself; move them into a child nn.Module"):
        sharded_roots(classifier)


# --------------------------------------------------------------------------- sharded checkpoints, one process
def write_sharded(path: Path, step: int = 5) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A sharded checkpoint of a trained toy module, written by the template's writer in one process."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    torch.manual_seed(step)
    module = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    module(torch.randn(8, 3)).sum().backward()
    optimizer.step()
    checkpoint = {
        "state_dict": module.state_dict(),
        "optimizer_states": [get_optimizer_state_dict(module, optimizer)],
        "epoch": 0,
        "global_step": step,
        "loops": {},
        "callbacks": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    sharded_save.save_sharded(checkpoint, path, f"t{step}", True, lambda: None)
    return module, optimizer


def test_a_sharded_checkpoint_merges_into_an_ordinary_one(tmp_path):
    folder = tmp_path / "last.ckpt"
    module, optimizer = write_sharded(folder)
    assert sharded.is_sharded_checkpoint(folder) and not list(tmp_path.glob(".*"))
    summary = sharded.read_summary(folder)
    assert summary["global_step"] == 5 and summary["state_dict"]["0.weight"].shape == (4, 3)
    assert summary["state_dict"]["0.weight"].device.type == "meta"  # no tensor was read
    merged = sharded_merge.load_full_checkpoint(folder)
    assert_close_weights(merged["state_dict"], module.state_dict())
    fresh = torch.optim.AdamW(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).parameters(), lr=0.1)
    fresh.load_state_dict(merged["optimizer_states"][0])  # keyed by position again, as Optimizer.state_dict
    for want, got in zip(optimizer.state.values(), fresh.state.values()):
        torch.testing.assert_close(got["exp_avg"], want["exp_avg"])
    # consolidate: the same as one file; the second time it refuses to replace it.
    out = consolidate([str(folder)])
    assert out == tmp_path / "last.consolidated.ckpt"
    assert torch.load(out, weights_only=True)["global_step"] == 5
    with pytest.raises(UserError, match="exists and is not replaced"):
        consolidate([str(folder)])
    plain = consolidate([str(folder), "--out", str(tmp_path / "w.pt"), "--weights_only"])
    assert_close_weights(torch.load(plain, weights_only=True), module.state_dict())


def test_consolidate_refuses_what_is_not_a_sharded_checkpoint(tmp_path):
    for bad, needle in [
        (tmp_path / "nope", "is missing"),
        (tmp_path, "is not a sharded checkpoint folder"),
    ]:
        with pytest.raises(UserError, match=needle):
            consolidate([str(bad)])
    result = run_cli(["consolidate", str(tmp_path / "nope.ckpt")], tmp_path)
    assert_clean_error(result, "consolidate: ", "nope.ckpt' is missing")
    assert result.returncode == 2


def test_a_half_written_sharded_checkpoint_is_never_chosen(tmp_path, capsys):
    checkpoints = tmp_path / "logs" / "toy" / "version_0" / "checkpoints"
    write_sharded(checkpoints / "last.ckpt", step=5)
    # Newer, but hidden (a save killed before its rename) or without meta.pt (not written by the template).
    write_sharded(checkpoints / "stage.ckpt", step=9)
    shutil.move(checkpoints / "stage.ckpt", sharded_save.partial_name(checkpoints / "last.ckpt", "dead"))
    write_sharded(checkpoints / "other.ckpt", step=12)
    (checkpoints / "other.ckpt" / sharded.LIGHTNING_META).unlink()
    path, detail = find_resume_checkpoint(RunName(tmp_path / "logs" / "toy"))
    assert path == checkpoints / "last.ckpt" and detail == "epoch 0, step 5"
    assert f"skipping checkpoint {checkpoints / 'other.ckpt'}" in capsys.readouterr().err
    trainer = Namespace(logger=Namespace(init_args=Namespace(save_dir=str(tmp_path / "logs"), name="toy")))
    chosen = choose_checkpoint("fit", None, "auto", trainer)
    assert chosen is not None and chosen.path == str(checkpoints / "last.ckpt") and chosen.continues
    assert list(checkpoints.glob(".*")), "nothing is removed before the run holds its lock (cli.run_command)"
    remove_partial_writes(chosen)
    assert not list(checkpoints.glob(".*")), "the hidden partial folder is removed when the run resumes"


def test_a_sharded_checkpoint_that_would_run_code_is_refused(tmp_path):
    folder = tmp_path / "last.ckpt"
    write_sharded(folder)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (folder / sharded.DCP_METADATA).write_bytes(pickle.dumps(Evil()))
    with pytest.raises(UserError, match=r"holds a pickled builtins.print, which only arbitrary code can load"):
        sharded.read_summary(folder)
    with pytest.raises(UserError, match="PROJECT_ALLOW_PICKLE=1"):
        sharded_merge.load_full_checkpoint(folder)


def test_replace_puts_a_file_or_folder_over_either(tmp_path):
    def make(path: Path, kind: str, text: str) -> Path:
        if kind == "dir":
            path.mkdir()
            (path / "x").write_text(text)
        else:
            path.write_text(text)
        return path

    def read(path: Path) -> str:
        return (path / "x").read_text() if path.is_dir() else path.read_text()

    for new_kind in ("dir", "file"):
        for old_kind in ("dir", "file", None):
            target = tmp_path / f"{new_kind}-over-{old_kind}"
            if old_kind:
                make(target, old_kind, "old")
            sharded_save.replace(make(tmp_path / f".new-{new_kind}-{old_kind}", new_kind, "new"), target)
            assert read(target) == "new" and [p.name for p in tmp_path.glob(".*")] == []


# ------------------------------------------------------------------------------ real processes over gloo
@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Path:
    """The digits job under scenario fsdp on 2 CPU processes: fit, test of the best checkpoint, export."""
    cwd = tmp_path_factory.mktemp("fsdp")
    result = fit(cwd, CPU_FSDP)
    assert result.returncode == 0, said(result)
    (run,) = run_dirs(cwd)
    return run


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """The fsdp run, rank 0 killed once the sharded checkpoint of step 20 is complete but not renamed."""
    cwd = tmp_path_factory.mktemp("killed")
    kill = json.dumps({"class_path": "fsdp_faults.KillBeforeShardedRename", "init_args": {"step": 20}})
    result = fit(cwd, CPU_FSDP, "--test_after_fit", "false", f"--trainer.callbacks+={kill}")
    assert result.returncode != 0, said(result)
    return cwd


@pytest.mark.slow
def test_fsdp_fit_trains_digits_tests_and_exports_a_plain_network(fsdp_run):
    plan = read_plan(fsdp_run)
    assert plan["scenario"] == "fsdp" and plan["world_size"] == 2 and plan["runtime"]["world_size"] == 2
    assert plan["strategy"]["name"] == "fsdp" and plan["runtime"]["strategy"] == "FullyShardStrategy"
    logged = read_scalars(fsdp_run)["test/acc"][-1][1]
    assert logged >= 0.8  # one epoch (chance: 0.1)
    checkpoints = fsdp_run / "checkpoints"
    assert sharded.is_sharded_checkpoint(checkpoints / "last.ckpt")
    assert len(list((checkpoints / "last.ckpt").glob("*.distcp"))) == 2 and not list(checkpoints.glob(".*"))
    # The export is the plain network (gathered from the shards of the best checkpoint), rebuilt without Lightning.
    state = torch.load(fsdp_run / "export" / "model.pt", weights_only=True)
    assert sorted(state) == sorted(DigitsNet(batch_norm=False, dropout=0).state_dict())
    code = (
        "import sys, torch\n"
        "from project.data.arrays import load_digits_tensors, seeded_split, split_sizes\n"
        "from project.extras.export.weights import rebuild\n"
        f"net = rebuild({str(fsdp_run / 'export')!r})\n"
        "x, y = load_digits_tensors()\n"
        f"_, _, test = seeded_split(x, y, split_sizes(len(x), {VAL_FRACTION}, 0.15), seed=0)\n"
        "with torch.no_grad():\n"
        "    acc = (net(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean().item()\n"
        "assert not any(m.startswith(('lightning', 'pytorch_lightning')) for m in sys.modules)\n"
        "print(acc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), check=True)
    assert float(out.stdout) == pytest.approx(logged, abs=1e-6)


@pytest.mark.slow
def test_fsdp_and_ddp_of_the_same_seed_reach_the_same_weights(fsdp_run, tmp_path):
    result = fit(tmp_path, CPU_DDP, "--test_after_fit", "false", "--trainer.limit_val_batches", "1")
    assert result.returncode == 0, said(result)
    (ddp,) = run_dirs(tmp_path)
    want = torch.load(ddp / "checkpoints" / "last.ckpt", weights_only=True)
    assert want["global_step"] == 1398 // 32
    assert_close_weights(weights(fsdp_run / "checkpoints" / "last.ckpt"), want["state_dict"])


@pytest.mark.slow
def test_hybrid_sharding_over_two_nodes_with_accumulation_reaches_the_same_weights(fsdp_run, tmp_path):
    """Two "machines" on localhost (1 process each): replicated across them, sharded within (shard degree 1),
    and 2 micro-batches of 8 per step: reduced on the last micro-batch only, as DDP's no_sync does."""
    syncs = tmp_path / "syncs.txt"
    recorder = json.dumps({"class_path": "fsdp_faults.GradientSyncRecorder", "init_args": {"path": str(syncs)}})
    args = ["fit", "--config", every_10_steps(), "--config", CPU_FSDP, *COMMON, "--test_after_fit", "false"]
    args += ["--parallel.fsdp.sharding", "hybrid", "--parallel.num_nodes", "2", "--parallel.devices", "1"]
    args += ["--parallel.per_device_batch_size", "8", f"--trainer.callbacks+={recorder}"]
    job = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "project", *args],
            cwd=tmp_path,
            env=cli_env({**job, "NODE_RANK": str(node)}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    for node in nodes:
        output = node.communicate(timeout=300)[0]
        assert node.returncode == 0, output[-4000:]
    (run,) = run_dirs(tmp_path)
    plan = read_plan(run)
    assert plan["degrees"] == {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "tp": 1, "dp": 2}
    assert plan["strategy"]["fsdp"]["sharding"] == "hybrid"
    assert plan["accumulation"] == 2 and syncs.read_text().split() == ["False", "True"] * (1398 // 32)
    assert_close_weights(weights(run / "checkpoints" / "last.ckpt"), weights(fsdp_run / "checkpoints" / "last.ckpt"))


@pytest.mark.slow
def test_a_kill_before_the_rename_leaves_the_previous_checkpoint_and_resume_on_2_and_1_processes_matches(
    killed, fsdp_run, tmp_path
):
    checkpoints = killed / "logs" / "digits" / "version_0" / "checkpoints"
    (partial,) = checkpoints.glob(".last.ckpt.*.tmp")
    assert sharded.read_summary(checkpoints / "last.ckpt")["global_step"] == 10
    assert (partial / sharded.LIGHTNING_META).is_file()  # complete, but never under the name
    want = weights(fsdp_run / "checkpoints" / "last.ckpt")
    one = tmp_path / "one"
    shutil.copytree(killed, one, symlinks=True)
    resumed = {}
    for name, cwd, layout in (("two", killed, CPU_FSDP), ("one", one, CPU_FSDP)):
        extra = ["--parallel.devices", "1"] if name == "one" else []
        result = fit(cwd, layout, *extra, "--resume", "auto", "--test_after_fit", "false")
        assert result.returncode == 0, said(result)
        assert "Resuming from" in result.stderr and "(epoch 0, step 10)" in result.stderr, said(result)
        last = cwd / "logs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
        assert sharded.is_sharded_checkpoint(last) == (name == "two")  # one process writes a plain file over it
        assert not list(last.parent.glob(".*"))
        resumed[name] = weights(last)
        # Exactly-once evaluation: the epoch's validation (uneven shards on 2 processes, or 1 process) as fsdp's.
        scalars, logged = read_scalars(last.parent.parent), read_scalars(fsdp_run)
        for tag in ("val/acc", "val/loss"):
            assert scalars[tag][-1][1] == pytest.approx(logged[tag][-1][1], abs=1e-5), (name, tag)
    assert_close_weights(resumed["two"], want)
    assert_close_weights(resumed["one"], want)


@pytest.mark.slow
def test_raw_ddp_weights_start_an_fsdp_run(fsdp_run, tmp_path):
    """The seed's DDP ``state_dict()`` (``module.`` keys) loads before sharding and tests as its source did."""
    export = torch.load(fsdp_run / "export" / "model.pt", weights_only=True)
    raw = tmp_path / "ddp_model.pt"
    torch.save({f"module.{key}": value for key, value in export.items()}, raw)
    args = ["test", "--config", DIGITS, "--config", CPU_FSDP, *COMMON, "--model.init_args.weights", str(raw)]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, said(result)
    (run,) = run_dirs(tmp_path)
    assert read_plan(run)["strategy"]["name"] == "fsdp"
    logged = read_scalars(fsdp_run)["test/acc"][-1][1]  # the best checkpoint's, which the export holds
    assert read_scalars(run)["test/acc"][-1][1] == pytest.approx(logged, abs=1e-6)


@pytest.mark.slow
def test_a_nan_in_one_ranks_gradient_shard_stops_every_rank_under_fsdp(tmp_path):
    """Each rank holds a shard of the reduced gradients: one rank's nan is seen by all, so every rank stops."""
    pytest.importorskip("project.extras.guards")  # the non-finite loss check is the guards layer's
    nan_in_rank_0 = ["--model.class_path", "fsdp_faults.NanInOneShard", "--model.init_args.step", "3"]
    result = fit(tmp_path, CPU_FSDP, *nan_in_rank_0, "--nonfinite.check_every_n_steps", "1")
    assert result.returncode == 1, said(result)
    assert "Traceback" not in result.stderr, said(result)
    assert "error: the training loss is not finite at step 3 (epoch 0) (rank 0: " in result.stderr, said(result)
    assert "no checkpoint was written yet" in result.stderr, said(result)
