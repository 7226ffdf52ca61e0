"""The program export: a network built in a LightningModule's ``__init__`` exported as a torch.export program.

:mod:`.export_program` captures the network on the inputs :mod:`.program_inputs` recorded in training and writes
``export/model.pt2`` beside the state dict (:class:`.export_program.ProgramExport`, which UnwrapEvalCallback calls
through ``Layer.network_exports``); ``project.extras.export.weights.rebuild`` loads it back with torch alone, after
:mod:`.program_check` refused a file that could run code. See docs/extras/export.md.
"""
