"""The sharding layer's benchmarks: sharded saves, sync and in the background.

``python -m bench.extras.sharding.sharded_saves``
"""
