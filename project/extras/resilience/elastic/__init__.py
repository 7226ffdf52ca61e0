"""Elastic torchrun jobs (``--nnodes MIN:MAX``): a lost node saved and said, a restart at the new size.

``job`` (the node range, the global batch a restart keeps, ending the job in one line), ``peer_loss`` (a survivor
saves alone) and ``callback`` (what a fit does on a loss, ``membership.json``).
"""
