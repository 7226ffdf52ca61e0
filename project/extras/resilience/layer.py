"""The resilience layer: hang forensics, elastic training and straggler detection for multi-process runs."""

from project.layers import Layer

LAYER = Layer(
    name="resilience",
    adds="hang reports (every rank's stacks at a stall), elastic torchrun jobs, straggler detection",
    sections=("project.extras.resilience.stragglers_config:add_stragglers_section",),
    callbacks=("project.extras.resilience.hooks:resilience_callbacks",),
    around_plan=("project.extras.resilience.hooks:elastic_plan",),
    explain_stall=("project.extras.resilience.hang:explain_stall",),
    observe_wait=("project.extras.resilience.hang.records:waiting_in",),
)
