"""The export layer: ``export/`` at the end of ``fit``, ``rebuild`` from it, torch.export programs (``model.pt2``)."""

from project.layers import Layer

LAYER = Layer(
    name="export",
    adds="`export/model.pt` + `model.json` at the end of `fit`, `rebuild` without Lightning; a network built in "
    "the LightningModule's `__init__` exported as a torch.export program (`model.pt2`)",
    callbacks=("project.extras.export.callback:export_callbacks",),
    network_exports=("project.extras.export.export_program:ProgramExport",),
)
