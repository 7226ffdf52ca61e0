"""The sharding layer's bad inputs, run by tests/distributed/test_bad_input.py beside the core's (same rules)."""

from helpers import DIGITS, FAST

BASE = ["--config", DIGITS, "--config", FAST]
CASES = {
    "tensor-parallel-size-not-a-number": dict(
        args=("fit", *BASE, "--parallel.tensor_parallel.size", "abc"),
        needles=("parallel.tensor_parallel.size='abc' is not a whole number",),
        absent=("Parser key", "Union"),
    ),
    "split-points-given-as-one-name": dict(
        args=("fit", *BASE, "--parallel.pipeline_parallel.split_points", "blocks.2"),
        needles=("split_points='blocks.2' is not a list ([a, b]) or null",),
    ),
    "ddp-flag-under-fsdp": dict(
        args=("fit", *BASE, "--parallel.scenario", "fsdp", "--parallel.ddp.find_unused_parameters", "true"),
        needles=("parallel.ddp.find_unused_parameters=True applies to DDP, and scenario 'fsdp' shards the model",),
    ),
    "sharded-checkpoint-without-metadata": dict(
        args=("test", *BASE, "--ckpt_path", "{tmp}/shards.ckpt"),
        needles=("shards.ckpt", "incomplete sharded", "no .metadata"),
        absent=("give a file inside it",),
    ),
    # Issue 35: each strategy's options moved into its subsection; an old flat name says its new one.
    "old-fsdp-flat-name-on-the-command-line": dict(
        args=("fit", *BASE, "--parallel.sharding", "hybrid"),
        needles=("parallel.sharding is now parallel.fsdp.sharding", "write --parallel.fsdp.sharding"),
        absent=("unknown option",),
    ),
    "option-of-another-subsection-in-a-config-file": dict(
        args=("fit", *BASE, "--config", "{tmp}/wrong_subsection.yaml"),
        needles=("unknown option 'sharding' in parallel.ddp; it is parallel.fsdp.sharding",),
        absent=("is not ParallelConfig",),
    ),
    "unknown-fsdp-option-on-the-command-line": dict(
        args=("fit", *BASE, "--parallel.fsdp.shards", "2"), needles=("unknown option 'shards' in parallel.fsdp",)
    ),
}
#: The files the cases read, written into each case's folder: a sharded checkpoint's shards and meta.pt without DCP's
#: .metadata; fsdp's option under ddp.
FILES = {
    **{f"shards.ckpt/{name}": "\0" * 16 for name in ("__0_0.distcp", "__1_0.distcp", "meta.pt")},
    "wrong_subsection.yaml": "parallel:\n  ddp:\n    sharding: full\n",
}
