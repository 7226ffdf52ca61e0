"""Benchmarks of the optional layers, one folder each (bench/extras/<layer>/); make strip removes a layer's."""
