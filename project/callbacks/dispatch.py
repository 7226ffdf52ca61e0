"""Per-batch hooks a callback does not override cost nothing: Lightning skips a hook that is not callable.

Dispatching an empty default costs about a microsecond: some 70 us a step over a dozen callbacks, on a CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

from lightning import Callback

#: The hooks Lightning calls on every callback for every optimizer step (no accumulation).
TRAIN_STEP_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
)
#: The hooks Lightning calls once per batch (training, validation, test and predict loops).
BATCH_HOOKS = (
    *TRAIN_STEP_HOOKS,
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


def skip_idle_batch_hooks(callbacks: Iterable[Callback]) -> int:
    """Make Lightning skip each callback's per-batch hooks that are :class:`~lightning.Callback`'s empty defaults.

    Returns how many; a hook the instance holds itself is kept (``project.lightning_private`` item 4).
    """
    skipped = 0
    for callback in callbacks:
        for hook in BATCH_HOOKS:
            if hook not in vars(callback) and getattr(type(callback), hook, None) is getattr(Callback, hook):
                setattr(callback, hook, None)
                skipped += 1
    return skipped
