"""Benchmarks of the storage layer (a run directory in object storage)."""
