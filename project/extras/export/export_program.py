"""Export a network that no class path rebuilds (built in a LightningModule's ``__init__``) as a torch.export program.

The network's inputs are recorded from its first forward call in training
(:class:`~.program_inputs.InputRecorder`); at the end of ``fit`` a CPU copy holding the exported weights is
captured by ``torch.export`` with a dynamic batch dimension and saved as ``export/model.pt2``
(:func:`export_program`, called by :class:`ProgramExport`). :func:`load_program` loads it back as a callable
module, with torch alone: neither the network's code nor Lightning is imported. A ``.pt2`` file can run code when
loaded, so it is checked first (:mod:`.program_check`). Nothing in this module imports Lightning.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.checkpoints.atomic import atomic_write
from project.checkpoints.loading import pickle_allowed
from project.errors import UserError, first_line
from project.extras.export.lightning_private import drop_compiled_call
from project.extras.export.network_exports import weights_only
from project.extras.export.program_check import check_program_file
from project.extras.export.program_inputs import Example, InputRecorder, leaves
from project.extras.export.weights import EXPORT_WEIGHTS

PROGRAM_FILE = "model.pt2"
#: ``model.json``'s ``format`` for a torch.export program.
PROGRAM_FORMAT = "torch.export"


class ProgramExportError(Exception):
    """Why a network could not be exported as a program (one line); the run goes on with its state dict."""


def cpu_copy(net: nn.Module, state: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
    """A deep copy of ``net`` on the CPU, its tensors taken from ``state`` (by name) where it has them.

    Each tensor is copied to the CPU once, directly: ``net`` (what ``test`` after fit evaluates) is untouched,
    and no second copy of it is ever made on its device. Tied weights stay tied.
    """
    memo: dict[int, Any] = {}
    named = itertools.chain(net.named_parameters(remove_duplicate=False), net.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        if id(tensor) not in memo:
            value = (state or {}).get(name, tensor).detach().to("cpu", copy=True)
            is_param = isinstance(tensor, nn.Parameter)
            memo[id(tensor)] = nn.Parameter(value, requires_grad=tensor.requires_grad) if is_param else value
    copied = copy.deepcopy(net, memo)
    for module in copied.modules():
        drop_compiled_call(module)  # a network compiled in place (parallel.compile) is exported eagerly
    return copied


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence torch.export: its warnings, its log lines and the partial graph it prints on a failure."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def export_program(
    net: nn.Module, example: Example, file: str | os.PathLike[str], state: Mapping[str, torch.Tensor] | None = None
) -> dict[str, Any]:
    """Export ``net`` (with ``state``'s weights, else its own), in eval mode, as a torch.export program at ``file``.

    The batch dimension is dynamic when the example has more than one sample. The program is checked against the
    network on the example and on a batch one sample larger, and must pass :func:`check_program_file`.

    Returns:
        What ``model.json`` says about the program besides its format: its inputs and torch version.

    Raises:
        ProgramExportError: torch.export cannot capture the network (the first line of its error), or the
            program does not compute what the network does; ``file`` is not written then.
    """
    try:
        model = cpu_copy(net, state).eval()
    except Exception as error:  # a module holding something deepcopy cannot copy (a lock, a file handle)
        raise ProgramExportError(f"{type(net).__name__} cannot be copied to the CPU: {first_line(error)}") from error
    dynamic = None
    if example.batch is not None and example.batch > 1:
        shapes, batch = torch.export.ShapesCollection(), torch.export.Dim("batch")
        for leaf in leaves((example.args, example.kwargs)):
            if example.batched(leaf):
                shapes[leaf] = {0: batch}
        dynamic = shapes.dynamic_shapes(model, example.args, example.kwargs)
    try:
        with _quiet():
            program = torch.export.export(model, example.args, example.kwargs, dynamic_shapes=dynamic, strict=False)
    except Exception as error:  # torch.export raises many types; its first line says what it could not capture
        raise ProgramExportError(f"torch.export cannot capture {type(net).__name__}: {first_line(error)}") from error
    with torch.no_grad():
        module = program.module()
        for inputs in (example, example.grown()) if dynamic is not None else (example,):
            _check_same_outputs(model, module, inputs)
    try:
        atomic_write(file, lambda handle: torch.export.save(program, handle))
        check_program_file(file, own=True)
    except Exception as error:  # UserError from the check; OSError; torch.export.save refusing a constant
        Path(file).unlink(missing_ok=True)
        raise ProgramExportError(f"its torch.export program was not saved: {first_line(error)}") from error
    return {"inputs": example.describe(), "torch": torch.__version__.split("+")[0]}


def _check_same_outputs(model: nn.Module, program: nn.Module, example: Example) -> None:
    try:
        with _quiet():
            want = list(leaves(model(*example.args, **example.kwargs)))
            got = list(leaves(program(*example.args, **example.kwargs)))
        assert len(got) == len(want), f"{len(got)} outputs instead of {len(want)}"
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w)
            else:
                assert g == w, f"{g!r} instead of {w!r}"
    except Exception as error:  # AssertionError, or the program (or the network) refusing the inputs
        raise ProgramExportError(
            f"the torch.export program of {type(model).__name__} does not compute what it does on a batch of "
            f"{example.batch}: {first_line(error)}"
        ) from error


def load_program(file: str | os.PathLike[str]) -> nn.Module:
    """``torch.export.load(file).module()``, after :func:`check_program_file` (skipped with PROJECT_ALLOW_PICKLE=1).

    Returns:
        A callable ``nn.Module`` (a GraphModule) computing what the exported network computed in eval mode; it
        cannot be switched to training mode (``.train()``/``.eval()`` raise).
    """
    path = Path(file)
    if not path.is_file():
        raise UserError(f"'{path}' does not exist; the export's program is written at the end of `fit`")
    if not pickle_allowed():
        # Not optional: torch.export.load itself unpickles and eval-s parts of the file (program_check).
        check_program_file(path)
    try:
        return torch.export.load(path).module()
    except Exception as error:  # a program of another torch version, a truncated file...
        raise UserError(
            f"'{path}' cannot be loaded as a torch.export program with torch {torch.__version__} "
            f"({first_line(error)}); load export/model.pt into the network built in your code instead"
        ) from error


class ProgramExport:
    """The layer's :class:`~project.extras.export.network_exports.NetworkExport`: ``model.pt2`` beside the state dict.

    Its example inputs are recorded from the network's first forward call in training (rank 0). Its failures are
    not raised: training is over and its checkpoints are written, so a network that torch.export cannot capture
    (or a sharded one) does not fail the run; one warning line says why and the export is the state dict only.
    """

    format = PROGRAM_FORMAT

    def __init__(self) -> None:
        self._recorder: InputRecorder | None = None

    def record(self, net: nn.Module) -> None:
        """Record the example inputs of ``net``'s next forward call (once per fit)."""
        if self._recorder is None:
            self._recorder = InputRecorder(net)

    def stop(self) -> None:
        """Record no more."""
        if self._recorder is not None:
            self._recorder.remove()

    def write(
        self, net: nn.Module, spec: dict[str, Any], state: Mapping[str, Any] | None, folder: Path, sharded: bool
    ) -> dict[str, Any]:
        """Write ``model.pt2`` and say so, or say in one warning line why not: the export is the state dict only."""
        network = spec["network"]
        example = self._recorder.example if self._recorder is not None else None
        try:
            if sharded:
                raise ProgramExportError(f"{network} is sharded over the processes: it is not exported as a program")
            if example is None:
                raise ProgramExportError(f"{network} was never called in training, so it has no example inputs")
            return {**spec, **export_program(net, example, folder / PROGRAM_FILE, state)}
        except ProgramExportError as error:
            reason = str(error)
        (folder / PROGRAM_FILE).unlink(missing_ok=True)  # a program of an earlier fit of this run is not this one
        sys.stderr.write(
            f"warning: no export/{PROGRAM_FILE}: {reason}; export/ holds the state dict {EXPORT_WEIGHTS} only "
            "(build the network in your code and load it with project.export.load_weights)\n"
        )
        sys.stderr.flush()
        return weights_only(network, reason)

    def load(self, folder: Path, spec: Mapping[str, Any]) -> nn.Module:
        """The program in ``folder``, checked and loaded with torch alone (:func:`load_program`)."""
        return load_program(folder / PROGRAM_FILE)
