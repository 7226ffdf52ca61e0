"""The ``nonfinite`` section (project/extras/guards/config.py) and which fits get the layer's check."""

from __future__ import annotations

import pytest
from jsonargparse import Namespace

from project.commands import COMMANDS
from project.errors import UserError
from project.extras.guards.config import NonFiniteConfig, nonfinite_settings
from project.extras.guards.hooks import guard_callbacks, lists_nonfinite_check
from project.extras.guards.nonfinite import NonFiniteLossCallback
from project.extras.guards.replica_guard import ReplicaGuard
from project.extras.guards.trainable_set import TrainableSetCallback

OWN = Namespace(class_path="project.extras.guards.nonfinite.NonFiniteLossCallback", init_args=Namespace())


class State:
    built = None


def test_the_defaults_stop_checking_every_10_steps():
    assert nonfinite_settings(None) == NonFiniteConfig("stop", 10)
    assert nonfinite_settings(Namespace(action="skip", check_every_n_steps=1)).action == "skip"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"action": "retry"}, "nonfinite.action='retry' must be one of stop, skip"),
        ({"check_every_n_steps": -1}, "nonfinite.check_every_n_steps=-1 >= 0 (0: off)"),
        ({"action": "skip"}, "nonfinite.action: skip needs nonfinite.check_every_n_steps: 1 (got 10)"),
    ],
)
def test_a_bad_section_is_refused_in_one_line(values, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        nonfinite_settings(values)


def test_a_fit_gets_the_check_unless_its_config_lists_one_or_turns_it_off():
    fit = COMMANDS["fit"]
    kinds = [type(c) for c in guard_callbacks(State(), fit, Namespace(trainer=Namespace(callbacks=[])))]
    assert kinds == [TrainableSetCallback, ReplicaGuard, NonFiniteLossCallback]
    listed = Namespace(trainer=Namespace(callbacks=[OWN]))
    assert lists_nonfinite_check([OWN]) and not lists_nonfinite_check(None)
    assert NonFiniteLossCallback not in [type(c) for c in guard_callbacks(State(), fit, listed)]
    off = Namespace(trainer=Namespace(callbacks=None), nonfinite=Namespace(action="stop", check_every_n_steps=0))
    assert NonFiniteLossCallback not in [type(c) for c in guard_callbacks(State(), fit, off)]
    validate = [type(c) for c in guard_callbacks(State(), COMMANDS["validate"], Namespace(trainer=None))]
    assert validate == [TrainableSetCallback, ReplicaGuard]
