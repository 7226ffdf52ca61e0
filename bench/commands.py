"""The command lines of the ways to train (raw, Lightning's floor, plain Lightning, the template) and their inputs."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import yaml

from bench.record import OUT_ENV, WARMUP_ENV
from bench.tasks import raw_pipeline
from bench.workloads import Row, Workload

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("raw", "floor", "plain", "template")
LABELS = {
    "raw": "raw PyTorch",
    "floor": "Lightning floor",
    "plain": "plain Lightning",
    "template": "template",
    "lean": "template without per-step callbacks",
    "hooks": "template, its per-step hooks timed",
}
#: `--ablate`: the template's config without the callbacks that act on every step (these classes).
PER_STEP_CALLBACKS = ("TimedCheckpoint", "NonFiniteLossCallback")


def digest(value: object) -> str:
    """A short name for what ``value`` holds (JSON-serialisable): files named by it never go stale or collide."""
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


def prepare_data(workload: Workload, directory: Path) -> Path:
    """Write the template's own training split (its datamodule, same seed) for the raw and plain runs."""
    import importlib

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{workload.name}-train-{digest([workload.data_class, workload.data_args()])}.pt"
    if not path.exists():
        import torch

        module, _, name = workload.data_class.rpartition(".")
        data = getattr(importlib.import_module(module), name)(**workload.data_args())
        data.setup("fit")
        if workload.block_size:  # the language model's training text, which raw and plain cut into windows alike
            torch.save({"tokens": data.train_set.tokens.contiguous()}, path)
        else:
            x, y = data.train_set.tensors
            torch.save({"x": x.contiguous(), "y": y.contiguous()}, path)
    return path


def write_template_config(workload: Workload, directory: Path) -> Path:
    """The workload as a config file layered over its :attr:`~bench.workloads.Workload.base_config`."""
    config = workload.template_config()
    path = directory / f"{workload.name}-{digest(config)}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def lean_config_path(directory: Path, base_config: str) -> Path:
    """Where :func:`write_lean_config` writes the lean layer of ``base_config``."""
    return directory / f"lean-{Path(base_config).stem}.yaml"


def write_lean_config(directory: Path, base_config: str = "configs/digits.yaml") -> tuple[Path, list[str]]:
    """``base_config``'s callbacks minus those that act on every step; the file and what it left out."""
    callbacks = yaml.safe_load((REPO / base_config).read_text())["trainer"]["callbacks"]

    def per_step(callback: dict) -> bool:
        return callback["class_path"].endswith(PER_STEP_CALLBACKS)

    dropped = [f"{c['class_path'].rsplit('.', 1)[-1]}{c.get('init_args') or ''}" for c in callbacks if per_step(c)]
    lean: dict = {"trainer": {"callbacks": [c for c in callbacks if not per_step(c)]}}
    if (REPO / "project/extras/guards/layer.py").is_file():  # the guards layer adds its non-finite check itself
        lean["nonfinite"] = {"check_every_n_steps": 0}
        dropped.append("NonFiniteLossCallback(the guards layer's nonfinite section)")
    path = lean_config_path(directory, base_config)
    path.write_text(yaml.safe_dump(lean))
    return path, dropped


def template_layout(row: Row) -> list[str]:
    """The template's own parallel config for the row."""
    if row.device == "gpu":
        return ["--config", str(REPO / "configs/parallel/single_gpu.yaml"), "--parallel.precision", "bf16-mixed"]
    if row.pipeline is not None:  # CPU processes over gloo, cut into stages
        processes = ["--parallel.scenario", "cpu", "--parallel.devices", str(row.processes)]
        return [*processes, *row.pipeline.template_args()]
    if row.tensor_parallel > 1:
        base = "configs/sharding/cpu_fsdp.yaml" if row.fsdp else "configs/parallel/cpu_ddp.yaml"
        split = ["--parallel.devices", str(row.processes), "--parallel.tensor_parallel.size", str(row.tensor_parallel)]
        return ["--config", str(REPO / base), *split]
    if row.processes == 1:
        return []  # the base config's `parallel.scenario: auto` is one CPU process here
    if row.processes == 2:
        return ["--config", str(REPO / "configs/parallel/cpu_ddp.yaml")]
    return ["--config", str(REPO / "configs/parallel/cpu_ddp.yaml"), "--parallel.devices", str(row.processes)]


def command(variant: str, row: Row, data: Path, config: Path) -> list[str]:
    """The command line that trains ``row`` the ``variant`` way."""
    python = sys.executable
    workload = row.workload
    if variant == "raw":
        name = raw_pipeline(workload.task) if row.pipeline else "bench/raw.py"
        script = [str(REPO / name), "--data", str(data), "--warmup", str(workload.warmup)]
        script += workload.script_args() + (row.pipeline.raw_args() if row.pipeline else [])
        if row.device == "gpu":
            script += ["--device", "cuda", "--bf16"]
        if row.processes == 1:
            return [python, *script]
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={row.processes}", *script]
    if variant in ("plain", "floor"):
        args = [python, "-m", "bench.plain", "--data", str(data), "--devices", str(row.processes)]
        if variant == "floor":
            args.append("--bare")
        if row.device == "gpu":
            args += ["--accelerator", "gpu", "--precision", "bf16-mixed"]
        return args + workload.script_args()
    if variant == "lean":
        lean = ["--config", str(lean_config_path(config.parent, workload.base_config))]
        return [*command("template", row, data, config)[:-1], *lean, "--trainer.callbacks+=bench.timing.StepTimer"]
    if variant == "hooks":
        return [*command("template", row, data, config)[:-1], "--trainer.callbacks+=bench.timing.HookTimer"]
    if variant == "template":
        return [
            python, "-m", "project", "fit",
            "--config", str(REPO / workload.base_config),
            *template_layout(row),
            "--config", str(config),
            "--trainer.callbacks+=bench.timing.StepTimer",
        ]  # fmt: skip
    raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")


def latency_commands(quick: bool = False) -> dict[str, dict[str, list[str]]]:
    """Start-up latency without training: ``--help`` of each, and the template's ``plan`` (quick: raw's)."""
    python = sys.executable
    if quick:
        return {"--help": {"raw": [python, str(REPO / "bench/raw.py"), "--help"]}}
    digits = str(REPO / "configs/digits.yaml")
    return {
        "--help": {
            "raw": [python, str(REPO / "bench/raw.py"), "--help"],
            "plain": [python, "-m", "bench.plain", "--help"],
            "template": [python, "-m", "project", "--help"],
        },
        # What `plan`, a command's --help and a refusal may cost at most: Lightning's own import, + 1 s.
        "import lightning": {"plain": [python, "-c", "import lightning"]},
        "plan": {"template": [python, "-m", "project", "plan", "--config", digits]},
        "fit --help": {"template": [python, "-m", "project", "fit", "--help"]},
        "refusal": {"template": [python, "-m", "project", "fit", "--config", digits, "--parallel.scenario", "warp"]},
    }


def environment(row: Row | None, record: Path | None, warmup: int = 0, threads: int = 1) -> dict[str, str]:
    """The child's environment: repository importable, where to write the record, threads per process.

    ``threads`` intra-op threads per process (0: torch's default), the same for every way. One is
    what torchrun gives each DDP process; with two per process, a shared 2-core machine falls into
    OpenMP spin-waits that slow a run by up to 10x and swamp what is measured here.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PL_", "TORCHELASTIC"))}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if record is not None:
        env[OUT_ENV] = str(record)
        env[WARMUP_ENV] = str(warmup)
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.pop("OMP_NUM_THREADS", None)
    return env
