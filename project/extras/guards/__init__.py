"""The run guards: a nan loss stops or skips its step, diverged replicas stop at the next save, fine-tuning under DDP.

The trainable set is followed under DDP and kept on resume. See docs/extras/guards.md.

Nothing is imported here: :mod:`.layer` is read on every command, before Lightning is imported.
"""
