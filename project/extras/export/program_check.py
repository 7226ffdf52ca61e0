"""Refuse a ``.pt2`` file before ``torch.export.load`` runs code it holds: only programs as this template writes them.

A ``.pt2`` file is not inert data: ``torch.export.load`` (torch 2.13) unpickles some of its parts with
``weights_only=False`` (weights and constants marked ``use_pickle``, "opaque" objects, and its example inputs
when a weights-only load of them fails), ``sympy.sympify``-s (``eval``-s) the shape expressions of its graph,
and ``.module()`` ``exec``-s its ``guards_code`` and writes its argument names into generated Python code. Each
of these runs code a crafted file chooses. So :func:`check_program_file` admits only what
:func:`.export_program.export_program` itself writes: the archive's known members, no pickled payloads,
example inputs that load weights-only, and expressions, guards and names that parse as plain arithmetic on sizes
and plain identifiers. It reads the archive with ``zipfile``, ``json`` and ``ast`` only.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from project.checkpoints.loading import ALLOW_PICKLE_ENV, check_integrity
from project.errors import UserError, first_line

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
# What a graph node may call: torch walks any `torch.`/`_operator.`/`math.` path with getattr and calls what it finds
# when the program runs (`torch.os.system` would run a command), so only registered operators (`torch.ops.aten.
# linear.default`, looked up, never imported), the symbolic size functions and arithmetic are admitted.
_OP = r"(?!__)\w+"
_TARGET = re.compile(
    rf"torch\.ops\.[a-z]\w*\.{_OP}(\.{_OP})?|torch\.sym_\w+|math\.[a-z]\w*"
    r"|_operator\.(getitem|add|sub|mul|truediv|floordiv|mod|pow|neg|pos|abs|eq|ne|lt|le|gt|ge|and_|or_|not_)"
)
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
    if key == "target":
        return None if isinstance(value, str) and _TARGET.fullmatch(value) else f"the call target {value!r}"
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

    Admits exactly what :func:`~.export_program.export_program` writes (see the module docstring); it reads
    the archive with ``zipfile``, ``json`` and ``ast`` only, and its example inputs with
    ``torch.load(weights_only=True)``.

    Args:
        file: The program file.
        own: The file was just written by :func:`~.export_program.export_program` (the message says so
            instead of blaming it).

    Raises:
        UserError: the file is damaged, or holds something beyond tensors, plain structures and arithmetic.
    """
    path = Path(file)
    check_integrity(path)  # also a zip's CRCs: a damaged program is not loaded
    try:
        with zipfile.ZipFile(path) as archive:
            found = _unsafe_in_archive(archive)
    except (zipfile.BadZipFile, OSError, KeyError, ValueError, TypeError, AttributeError, RecursionError) as error:
        found = f"an unreadable or unexpected part ({first_line(error)})"
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
