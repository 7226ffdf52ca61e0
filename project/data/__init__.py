"""Datamodules: the embedded digits set and a synthetic set for scale tests and benchmarks."""
