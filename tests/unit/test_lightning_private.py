"""The private Lightning names the template depends on, all listed in project/lightning_private.py.

If a Lightning upgrade moves one of them, this fails here, by name, instead of somewhere in a run.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import lightning as L

from project import lightning_private
from project.lightning_private import SUBPROCESS_LAUNCHER, WRAPPER_ATTRIBUTE, WRAPPER_CLASS_NAMES

PROJECT = Path(__file__).resolve().parents[2] / "project"


def test_lightnings_launcher_keeps_the_processes_it_started_in_procs_and_can_kill_them():
    module_name, _, class_name = SUBPROCESS_LAUNCHER.rpartition(".")
    launcher = getattr(importlib.import_module(module_name), class_name)
    assert "procs" in inspect.getsource(launcher.__init__)
    assert callable(launcher.kill)


def test_lightnings_wrappers_keep_the_module_where_unwrap_looks():
    from lightning.fabric.wrappers import _FabricModule
    from torch import nn

    from project.parallel.ddp import unwrap

    assert _FabricModule.__name__ in WRAPPER_CLASS_NAMES
    assert WRAPPER_ATTRIBUTE in inspect.getsource(_FabricModule.__init__)
    inner = nn.Linear(2, 2)
    assert unwrap(_FabricModule(inner, strategy=None)) is inner
    assert L.__version__ == "2.6.6", "a new Lightning: re-check every name in project/lightning_private.py"


def test_no_other_module_of_the_project_uses_a_private_lightning_name():
    private = re.compile(r"from lightning[\w.]* import [^\n]*\b_\w+|lightning[\w.]*\._\w+")
    offenders = [
        str(path.relative_to(PROJECT))
        for path in PROJECT.rglob("*.py")
        if path.name != "lightning_private.py" and private.search(path.read_text())
    ]
    assert offenders == []
    assert lightning_private.__doc__ and "public API" in lightning_private.__doc__


def test_lightnings_dispatch_skips_a_hook_that_is_none_and_still_calls_overridden_ones():
    from lightning.pytorch.demos.boring_classes import BoringModel

    from project.callbacks.dispatch import BATCH_HOOKS, skip_idle_batch_hooks

    class Counting(L.Callback):
        def __init__(self) -> None:
            self.ends = 0

        def on_train_batch_end(self, *args: object) -> None:
            self.ends += 1

    idle, counting = L.Callback(), Counting()
    assert skip_idle_batch_hooks([idle, counting]) == 2 * len(BATCH_HOOKS) - 1
    assert all(getattr(idle, hook) is None for hook in BATCH_HOOKS)
    assert counting.on_before_backward is None and callable(counting.on_train_batch_end)
    trainer = L.Trainer(
        max_steps=3, limit_val_batches=1, callbacks=[idle, counting], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    # Were Lightning to call a hook without testing callable(), the None hooks would raise TypeError here.
    trainer.fit(BoringModel())
    assert counting.ends == 3


def test_a_hook_the_callback_instance_holds_itself_is_not_skipped():
    from project.callbacks.dispatch import skip_idle_batch_hooks

    calls = []
    callback = L.Callback()
    callback.on_train_batch_end = lambda *args: calls.append(args)  # assigned on the instance, not the class
    skip_idle_batch_hooks([callback])
    assert callable(callback.on_train_batch_end) and callback.on_train_batch_start is None


PRIVATE_NAMES = (
    "_generate_state_key",
    "_last_lr",
    "_compiled_call_impl",
    "_load_state_dict",
    "_EmptyStateDictLoadPlanner",
)


def test_the_private_torch_and_callback_names_are_used_in_lightning_private_only():
    offenders = [
        f"{path.relative_to(PROJECT)}: {name}"
        for path in PROJECT.rglob("*.py")
        if path.name != "lightning_private.py"
        for name in PRIVATE_NAMES
        if re.search(rf"\b{name}\b", path.read_text())
    ]
    assert offenders == []


def test_the_private_callback_names_still_exist():
    from lightning.pytorch.callbacks import ModelCheckpoint

    assert lightning_private.state_key(ModelCheckpoint(), monitor="m", mode="min").startswith("ModelCheckpoint{")


def test_the_trainer_registers_no_signal_handler_once_kept_away():
    import signal

    import lightning as L

    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    before = signal.getsignal(signal.SIGTERM)
    lightning_private.keep_own_signal_handlers(trainer)
    trainer._signal_connector.register_signal_handlers()  # what Trainer._run calls before the sanity check
    assert signal.getsignal(signal.SIGTERM) is before
    trainer._signal_connector.teardown()
    assert signal.getsignal(signal.SIGTERM) is before
