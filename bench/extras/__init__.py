"""Benchmarks of the optional layers: ``bench/extras/<layer>/`` (``make strip`` removes a layer's with it)."""
