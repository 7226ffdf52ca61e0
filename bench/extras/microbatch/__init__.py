"""The microbatch layer's benchmark: ``micro_batch: auto`` against every fixed micro-batch (:mod:`.micro_batch`)."""
