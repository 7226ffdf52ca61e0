"""Model parallelism: FSDP, ZeRO-1, tensor and pipeline parallelism, sharded checkpoints and ``consolidate``."""
