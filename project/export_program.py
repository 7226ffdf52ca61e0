"""Export a network that no class path rebuilds (built in a LightningModule's ``__init__``) as a torch.export program.

The network's inputs are recorded from its first forward call in training (:class:`InputRecorder`); at the end
of ``fit`` a CPU copy holding the exported weights is captured by ``torch.export`` with a dynamic batch dimension
and saved as ``export/model.pt2`` (:func:`export_program`). :func:`load_program` loads it back as a callable
module, with torch alone: neither the network's code nor Lightning is imported.

A ``.pt2`` file is not inert data: ``torch.export.load`` (torch 2.13) unpickles some of its parts with
``weights_only=False`` (weights and constants marked ``use_pickle``, "opaque" objects, and its example inputs
when a weights-only load of them fails), ``sympy.sympify``-s (``eval``-s) the shape expressions of its graph,
and ``.module()`` ``exec``-s its ``guards_code`` and writes its argument names into generated Python code. Each
of these runs code a crafted file chooses. So :func:`check_program_file` admits only what :func:`export_program`
itself writes: the archive's known members, no pickled payloads, example inputs that load weights-only, and
expressions, guards and names that parse as plain arithmetic on sizes and plain identifiers. Nothing in this
module imports Lightning.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import io
import itertools
import json
import logging
import os
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.checkpoints.atomic import atomic_write
from project.checkpoints.loading import ALLOW_PICKLE_ENV, check_integrity, pickle_allowed
from project.errors import UserError

PROGRAM_FILE = "model.pt2"
#: ``model.json``'s ``format`` for a torch.export program, and for a network exported as its state dict only.
PROGRAM_FORMAT = "torch.export"
STATE_DICT_FORMAT = "state_dict"
#: Samples of the first training batch kept as example inputs: few (they live until the end of fit), and more
#: than 1, since torch.export specializes a dimension of size 0 or 1 instead of keeping it dynamic.
EXAMPLE_BATCH = 4


class ProgramExportError(Exception):
    """Why a network could not be exported as a program (one line); the run goes on with its state dict."""


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``fn`` applied to every tensor in nested tuples, lists and dicts; other values as they are."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


@dataclass
class Example:
    """Example inputs of a network: positional and keyword arguments, on CPU, detached.

    ``batch``: the size of their batch dimension (dim 0 of every tensor whose dim 0 matched the first tensor's
    in the recorded call), or ``None`` when no tensor has one.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    batch: int | None = None

    @classmethod
    def of_call(cls, args: tuple[Any, ...], kwargs: dict[str, Any], keep: int = EXAMPLE_BATCH) -> Example:
        """The first ``keep`` samples of a call's inputs (copies, so the batch they came from is not held)."""
        first = next((t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim() > 0), None)
        size = None if first is None else first.shape[0]

        def small(t: torch.Tensor) -> torch.Tensor:
            t = t.detach()
            return (t[:keep] if t.dim() > 0 and t.shape[0] == size else t).to("cpu", copy=True)

        return cls(_map(tuple(args), small), _map(dict(kwargs), small), None if size is None else min(size, keep))

    def batched(self, value: Any) -> bool:
        """Whether ``value`` is one of the tensors with the batch dimension."""
        return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == self.batch

    def grown(self) -> Example:
        """The same inputs with one more sample (the first one again): a batch of another size."""
        return Example(
            _map(self.args, lambda t: torch.cat([t, t[:1]]) if self.batched(t) else t),
            _map(self.kwargs, lambda t: torch.cat([t, t[:1]]) if self.batched(t) else t),
            None if self.batch is None else self.batch + 1,
        )

    def describe(self) -> list[str]:
        """``args[0]: float32[batch, 64]``: each tensor input, its batch dimension named ``batch`` if dynamic."""
        dynamic = self.batch is not None and self.batch > 1
        out = []
        for where, value in (("args", self.args), ("kwargs", self.kwargs)):
            for key, leaf in _paths(value):
                if isinstance(leaf, torch.Tensor):
                    dims = [str(d) for d in leaf.shape]
                    if dynamic and self.batched(leaf):
                        dims[0] = "batch"
                    out.append(f"{where}{key}: {str(leaf.dtype).removeprefix('torch.')}[{', '.join(dims)}]")
        return out


def _paths(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _paths(v, f"{prefix}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, f"{prefix}[{k!r}]")
    else:
        yield prefix, value


class InputRecorder:
    """Record a network's example inputs from its next forward call, then unhook (a forward pre-hook)."""

    def __init__(self, net: nn.Module) -> None:
        self.example: Example | None = None
        # Called eagerly even inside a compiled network (a graph break once): the hook keeps Python state.
        self._handle = net.register_forward_pre_hook(torch.compiler.disable(self._record), with_kwargs=True)

    def _record(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.example is None:
            self.example = Example.of_call(args, kwargs)
        self.remove()

    def remove(self) -> None:
        """Unhook (idempotent); :attr:`example` stays."""
        self._handle.remove()


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
        module._compiled_call_impl = None  # a network compiled in place (parallel.compile) is exported eagerly
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


def _first_line(error: BaseException) -> str:
    lines = [" ".join(line.split()) for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


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
        raise ProgramExportError(f"{type(net).__name__} cannot be copied to the CPU: {_first_line(error)}") from error
    dynamic = None
    if example.batch is not None and example.batch > 1:
        shapes, batch = torch.export.ShapesCollection(), torch.export.Dim("batch")
        for leaf in _leaves((example.args, example.kwargs)):
            if example.batched(leaf):
                shapes[leaf] = {0: batch}
        dynamic = shapes.dynamic_shapes(model, example.args, example.kwargs)
    try:
        with _quiet():
            program = torch.export.export(model, example.args, example.kwargs, dynamic_shapes=dynamic, strict=False)
    except Exception as error:  # torch.export raises many types; its first line says what it could not capture
        raise ProgramExportError(f"torch.export cannot capture {type(net).__name__}: {_first_line(error)}") from error
    with torch.no_grad():
        module = program.module()
        for inputs in (example, example.grown()) if dynamic is not None else (example,):
            _check_same_outputs(model, module, inputs)
    try:
        atomic_write(file, lambda handle: torch.export.save(program, handle))
        check_program_file(file, own=True)
    except Exception as error:  # UserError from the check; OSError; torch.export.save refusing a constant
        Path(file).unlink(missing_ok=True)
        raise ProgramExportError(f"its torch.export program was not saved: {_first_line(error)}") from error
    return {"inputs": example.describe(), "torch": torch.__version__.split("+")[0]}


def _check_same_outputs(model: nn.Module, program: nn.Module, example: Example) -> None:
    try:
        with _quiet():
            want = list(_leaves(model(*example.args, **example.kwargs)))
            got = list(_leaves(program(*example.args, **example.kwargs)))
        assert len(got) == len(want), f"{len(got)} outputs instead of {len(want)}"
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w)
            else:
                assert g == w, f"{g!r} instead of {w!r}"
    except Exception as error:  # AssertionError, or the program (or the network) refusing the inputs
        raise ProgramExportError(
            f"the torch.export program of {type(model).__name__} does not compute what it does on a batch of "
            f"{example.batch}: {_first_line(error)}"
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
        # Not optional: torch.export.load itself unpickles and eval-s parts of the file (module docstring).
        check_program_file(path)
    try:
        return torch.export.load(path).module()
    except Exception as error:  # a program of another torch version, a truncated file...
        raise UserError(
            f"'{path}' cannot be loaded as a torch.export program with torch {torch.__version__} "
            f"({_first_line(error)}); load export/model.pt into the network built in your code instead"
        ) from error


# What check_program_file admits (see the module docstring).
_MEMBERS = re.compile(
    r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id|models/model\.json"
    r"|data/sample_inputs/model\.pt|data/weights/model_weights_config\.json|data/weights/weight_\d+"
    r"|data/constants/model_constants_config\.json|data/constants/tensor_\d+"
)
_NAME = re.compile(r"[\w.+-]*")  # parameter, node, argument and symbol names, dtypes, devices
_TEXT = re.compile(r"[^'\"\\\n\r]*")  # a string argument of an op (an einsum equation): no way out of a literal
_GUARD_TEXT = re.compile(r"[^\"\\\n\r]*")  # torch puts a guard's text into a "..." literal of generated code
_SYMBOL = re.compile(r"[a-z]{1,3}\d+")
_FREE_TEXT = frozenset({"metadata", "torch_version"})  # stack traces, module paths: kept as strings, never run
# fmt: off
# The functions in the shape expressions torch writes (sympy's and torch.utils._sympy.functions').
_SYMPY_FUNCS = frozenset({
    "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Abs", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
    "And", "Or", "Not", "floor", "ceiling", "Mod", "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv",
    "CeilToInt", "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
    "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "Equality",
    "Unequality",
})
# fmt: on
_SYMPY_ATOMS = frozenset({"oo", "zoo", "nan", "true", "false"})
_ASSUMPTIONS = frozenset({"positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite"})
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not)
_OPERATORS += (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.And, ast.Or)
_TREESPEC_TYPES = frozenset({None, "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict"})


def _arithmetic(node: ast.AST, leaf: Callable[[ast.AST], bool]) -> bool:
    """Whether ``node`` is arithmetic, comparisons and logic over constants and the leaves ``leaf`` admits."""
    if isinstance(node, ast.Expression):
        return _arithmetic(node.body, leaf)
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, _OPERATORS) and _arithmetic(node.left, leaf) and _arithmetic(node.right, leaf)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, _OPERATORS) and _arithmetic(node.operand, leaf)
    if isinstance(node, ast.BoolOp):
        return isinstance(node.op, _OPERATORS) and all(_arithmetic(v, leaf) for v in node.values)
    if isinstance(node, ast.Compare):
        parts = [node.left, *node.comparators]
        return all(isinstance(op, _OPERATORS) for op in node.ops) and all(_arithmetic(p, leaf) for p in parts)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
        return True
    return leaf(node)


def _sympy_leaf(node: ast.AST) -> bool:
    """``s31``, ``oo``, ``Symbol('s31', positive=True)``, ``Max(...)``: what torch writes for a shape expression."""
    if isinstance(node, ast.Name):
        return node.id in _SYMPY_ATOMS or _SYMBOL.fullmatch(node.id) is not None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return False
    if node.func.id == "Symbol":
        (name,) = node.args if len(node.args) == 1 else (None,)
        named = isinstance(name, ast.Constant) and isinstance(name.value, str) and _SYMBOL.fullmatch(name.value)
        return bool(named) and all(
            k.arg in _ASSUMPTIONS and isinstance(k.value, ast.Constant) and isinstance(k.value.value, bool)
            for k in node.keywords
        )
    return node.func.id in _SYMPY_FUNCS and not node.keywords and all(_arithmetic(a, _sympy_leaf) for a in node.args)


def _guard_leaf(node: ast.AST) -> bool:
    """``L['x'].size()[0]``, ``math.isnan(...)``, ``'text'``: what torch writes for a guard on the inputs."""
    if isinstance(node, ast.Constant):
        return node.value is None or (isinstance(node.value, str) and _NAME.fullmatch(node.value) is not None)
    if isinstance(node, ast.Name):
        return node.id in ("L", "inf")
    if isinstance(node, ast.Subscript):
        key = node.slice
        key_ok = isinstance(key, ast.Constant) and (type(key.value) is int or _guard_leaf(key))
        return key_ok and _guard_leaf(node.value)
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in ("inf", "nan")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords:
        func, args = node.func, node.args
        if func.attr in ("size", "stride", "storage_offset", "dim"):
            return _guard_leaf(func.value) and all(isinstance(a, ast.Constant) and type(a.value) is int for a in args)
        is_math = isinstance(func.value, ast.Name) and func.value.id == "math"
        return is_math and func.attr in ("isnan", "isinf", "floor", "ceil") and all(_guard(a) for a in args)
    return False


def _guard(node: ast.AST) -> bool:
    return _arithmetic(node, _guard_leaf)


def _parses(text: Any, check: Callable[[ast.AST], bool]) -> bool:
    try:
        return isinstance(text, str) and check(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError, RecursionError):
        return False


def _treespec_ok(text: Any) -> bool:
    """An input/output structure of plain tuples, lists and dicts keyed by names (no imported types, no enums)."""

    def node_ok(spec: Any) -> bool:
        if not isinstance(spec, dict) or spec.get("type") not in _TREESPEC_TYPES:
            return False
        context = spec.get("context")
        keys = json.loads(context) if isinstance(context, str) else context
        keys_ok = keys is None or (
            isinstance(keys, list) and all(type(k) is int or (isinstance(k, str) and _NAME.fullmatch(k)) for k in keys)
        )
        children = spec.get("children_spec")
        return keys_ok and isinstance(children, list) and all(node_ok(c) for c in children)

    try:
        data = json.loads(text)
        return isinstance(data, list) and len(data) == 2 and node_ok(data[1])
    except (TypeError, ValueError, RecursionError):
        return False


def _unsafe_in_program(value: Any, key: str = "") -> str | None:
    """The first part of ``models/model.json`` that torch would run as code or that names more than a tensor."""
    if key in _FREE_TEXT:
        return None
    if key == "expr_str":
        return None if _parses(value, lambda n: _arithmetic(n, _sympy_leaf)) else f"the shape expression {value!r}"
    if key == "guards_code":
        guards = value if isinstance(value, list) else [value]
        bad = [g for g in guards if not (isinstance(g, str) and _GUARD_TEXT.fullmatch(g) and _parses(g, _guard))]
        return f"the guard code {bad[0]!r}" if bad else None
    if key in ("in_spec", "out_spec"):
        return None if _treespec_ok(value) else f"the input/output structure {value!r}"
    if "custom_obj" in key and value:
        return f"a custom object ({key})"
    if isinstance(value, dict):
        for k, v in value.items():
            found = f"the name {k!r}" if not _NAME.fullmatch(k) else _unsafe_in_program(v, k)
            if found is not None:
                return found
    elif isinstance(value, list):
        return next((found for v in value if (found := _unsafe_in_program(v, key)) is not None), None)
    elif isinstance(value, str):
        ok = _TEXT.fullmatch(value) if key in ("as_string", "as_strings") else _NAME.fullmatch(value)
        return None if ok else f"the {key or 'value'} {value!r}"
    return None


def check_program_file(file: str | os.PathLike[str], own: bool = False) -> None:
    """Refuse a ``.pt2`` file that ``torch.export.load`` could not load without running code it holds.

    Admits exactly what :func:`export_program` writes (see the module docstring); it reads the archive with
    ``zipfile``, ``json`` and ``ast`` only, and its example inputs with ``torch.load(weights_only=True)``.

    Args:
        file: The program file.
        own: The file was just written by :func:`export_program` (the message says so instead of blaming it).

    Raises:
        UserError: the file is damaged, or holds something beyond tensors, plain structures and arithmetic.
    """
    path = Path(file)
    check_integrity(path)  # also a zip's CRCs: a damaged program is not loaded
    try:
        with zipfile.ZipFile(path) as archive:
            found = _unsafe_in_archive(archive)
    except (zipfile.BadZipFile, OSError, KeyError, ValueError, TypeError, AttributeError, RecursionError) as error:
        found = f"an unreadable or unexpected part ({_first_line(error)})"
    if found is None:
        return
    if own:
        raise UserError(f"it holds {found}, which rebuild would refuse")
    raise UserError(
        f"'{path}' holds {found}: torch.export.load runs code from a .pt2 file (it unpickles some parts, evaluates "
        "its shape expressions and guard code, writes its names into Python code), so only programs as this "
        f"template exports them are loaded; if you trust the file, rerun with {ALLOW_PICKLE_ENV}=1"
    )


def _unsafe_in_archive(archive: zipfile.ZipFile) -> str | None:
    names = archive.namelist()
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or any("/" not in name for name in names):
        return "files outside one archive folder"
    (root,) = roots
    for name in names:
        if not _MEMBERS.fullmatch(name[len(root) + 1 :]):
            return f"the member {name!r}"
    for kind, prefix in (("weights", "weight_"), ("constants", "tensor_")):
        config = json.loads(archive.read(f"{root}/data/{kind}/model_{kind}_config.json"))
        for fqn, meta in config["config"].items():
            if meta.get("use_pickle") is not False or not re.fullmatch(rf"{prefix}\d+", meta.get("path_name", "")):
                return f"pickled {kind} ({fqn!r})"
        if (found := _unsafe_in_program(config)) is not None:
            return found
    try:
        torch.load(io.BytesIO(archive.read(f"{root}/data/sample_inputs/model.pt")), weights_only=True)
    except Exception as error:  # torch.export.load would retry with weights_only=False: unpickling any code
        pickled = re.search(r"GLOBAL ([\w.]+)", str(error))
        return f"example inputs holding {f'a pickled {pickled.group(1)}' if pickled else 'pickled objects'}"
    return _unsafe_in_program(json.loads(archive.read(f"{root}/models/model.json")))
