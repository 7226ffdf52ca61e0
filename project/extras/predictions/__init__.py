"""``predict`` writes ``predictions.csv``: the writer (:mod:`.writer`), its rows and CSV text (:mod:`.rows`).

:mod:`.hook` adds the writer to every ``predict`` whose config lists no prediction writer. See
docs/extras/predictions.md.
"""
