"""The compiled call of a module compiled in place is where the compile and export layers look for it."""

import pytest
import torch

from project.extras.compile.lightning_private import compiled_call


def test_a_module_compiled_in_place_keeps_its_compiled_call():
    net = torch.nn.Linear(2, 2)
    assert compiled_call(net) is None
    net.compile()
    assert compiled_call(net) is not None
    export = pytest.importorskip("project.extras.export.lightning_private")
    export.drop_compiled_call(net)
    assert compiled_call(net) is None
