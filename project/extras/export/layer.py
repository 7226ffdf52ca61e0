"""The export layer: a network that no class path rebuilds exported as a torch.export program (``model.pt2``)."""

from project.layers import Layer

LAYER = Layer(
    name="export",
    adds="a network built in the LightningModule's `__init__` exported as a torch.export program (`model.pt2`)",
    network_exports=("project.extras.export.export_program:ProgramExport",),
)
