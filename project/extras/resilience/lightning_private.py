"""The resilience layer's private torch and Lightning names, with the public API that is missing.

- torch's Flight Recorder, read in memory: ``torch._C._distributed_c10d._dump_fr_trace_json`` (the NCCL build's
  ``_dump_nccl_trace_json``); torch's public reader only parses the files a crash handler dumps
  (:func:`flight_recorder_json`). Autograd's ``_engine_run_backward`` frame marks DDP's gradient all-reduce.
- A Lightning strategy's process-group timeout, ``_timeout`` (:func:`process_group_timeout_s`): the stall threshold's
  base.
- The checkpoint dump without its write, ``trainer._checkpoint_connector.dump_checkpoint``: a survivor of a lost peer
  saves alone, with no collective (:func:`dump_checkpoint`); Lightning's ``_batches_that_stepped`` in a checkpoint.
"""

from __future__ import annotations

from typing import Any

#: Autograd's backward frame: a collective under it is DDP's gradient all-reduce.
AUTOGRAD_BACKWARD_FRAME = "_engine_run_backward"
#: Lightning's count of the batches whose optimizer stepped, in a checkpoint's ``epoch_loop.state_dict``.
BATCHES_STEPPED_KEY = "_batches_that_stepped"


def flight_recorder_json() -> str | None:
    """Torch's Flight Recorder (every collective of this process, in a ring) as JSON; ``None`` when it is off."""
    from torch._C import _distributed_c10d as c10d

    for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
        dump = getattr(c10d, name, None)
        if dump is not None:
            try:
                text = dump(True, False)  # (include collectives, only active ones)
            except RuntimeError:  # this build's recorder is off (its ring has no entries to give)
                continue
            text = text.decode() if isinstance(text, bytes) else text
            return text if '"entries"' in text else None
    return None


def process_group_timeout_s(strategy: Any) -> float | None:
    """The process-group timeout a Lightning DDP/model-parallel strategy was built with (``_timeout``), in seconds."""
    timeout = getattr(strategy, "_timeout", None)
    return timeout.total_seconds() if timeout is not None else None


def dump_checkpoint(trainer: Any) -> dict[str, Any]:
    """The full training checkpoint of this moment, built by the Trainer's checkpoint connector (nothing written).

    ``trainer.save_checkpoint`` writes on rank 0 and meets the others in a barrier; a survivor of a lost peer writes
    alone, so it needs the dump without the write.
    """
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
