"""The layers' own benchmarks, one folder each (``make strip`` removes a layer's with it)."""
