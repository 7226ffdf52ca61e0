"""A character-level GPT beside digits: ``configs/gpt/chargpt.yaml`` trains it on Python's bundled help text.

:mod:`.gpt` is the network (a plain ``nn.Module``, no Lightning; its projections have the names a tensor-parallel
plan addresses, its blocks are what a pipeline cuts), :mod:`.language_model` the LightningModule (loss, tokens per
second from :mod:`.token_rate`, ``predict`` writes text through :mod:`.generate`), :mod:`.chargpt` the datamodule
over :mod:`.chartext`'s corpus, vocabulary and windows. The core knows none of them: the config names them by class
path. See docs/extras/gpt.md.
"""
