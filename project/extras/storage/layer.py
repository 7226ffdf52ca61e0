"""The storage layer: a run directory at an fsspec URL (``save_dir: s3://bucket/prefix``), each node's disk a cache."""

from project.layers import Layer

LAYER = Layer(
    name="storage",
    adds="`save_dir: s3://bucket/prefix`: runs in object storage (commit-then-point checkpoints, a lease, pulls)",
    sections=("project.extras.storage.store:add_storage_options",),
    run_stores=("project.extras.storage.store:ObjectStore",),
)
