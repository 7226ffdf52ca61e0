"""Benchmarks: the raw PyTorch loop vs plain Lightning vs this template, on the same work.

``python -m bench`` (``make bench``) runs everything and writes ``bench/results/results.md`` and
``results.png``; ``python -m bench --quick`` is the seconds-long version the test suite runs.
"""
