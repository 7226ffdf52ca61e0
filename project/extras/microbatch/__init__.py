"""``parallel.micro_batch: auto``: the largest micro-batch that fits on every rank, split finer when memory runs out.

An integer ``micro_batch`` is the core's (``per_device_batch_size``'s other name). With this layer ``auto`` is taken
off the section before the plan is resolved and every plan says what it fixes (:mod:`.plan`); at the start of
``fit`` trial steps on real samples, whose effects are undone (:mod:`.trial`), pick the size (:mod:`.search`), and
each training step is then split into micro-batches by the template itself, finer on every rank when one runs out
of memory (:mod:`.split_step`). See docs/extras/microbatch.md.
"""
