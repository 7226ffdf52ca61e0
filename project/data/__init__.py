"""Datamodules: the embedded digits set, and the base every template datamodule shares."""
