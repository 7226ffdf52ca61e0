"""The lr layer's private torch name still works (project/extras/lr/lightning_private.py)."""

import torch

from project.extras.lr.lightning_private import set_last_lr


def test_a_schedulers_last_lr_follows_its_scaled_rates():
    net = torch.nn.Linear(2, 2)
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(net.parameters(), lr=0.5), step_size=1)
    scheduler.optimizer.param_groups[0]["lr"] = 0.25
    set_last_lr(scheduler)
    assert scheduler.get_last_lr() == [0.25]
