"""FSDP2 (``fully_shard``) applied to any LightningModule.

The strategy, its units, sharding, evaluation and checkpoints: one module each.
"""
