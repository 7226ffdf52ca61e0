"""Bad command lines and config files as one line each: the parser's errors and the config-file checks."""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NoReturn

import yaml
from lightning.pytorch.cli import LightningArgumentParser

from project.dotted import import_failure
from project.errors import UserError, debug_enabled, exit_with


class ProjectArgumentParser(LightningArgumentParser):
    """LightningArgumentParser whose errors are one line and a tip, not a page of usage."""

    #: Old option keys -> their keys now (``parallel.sharding`` -> ``parallel.fsdp.sharding``), set with the section.
    moved_options: Mapping[str, str] = MappingProxyType({})

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """Report a bad command line or config in one line and exit with code 2."""
        if not self.exit_on_error or debug_enabled():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        failed = class_path_failure(message)
        if failed:  # the user's module: the import error is the fix, not the parser's --help
            exit_with(UserError(failed))
        detail = (
            _unknown_option(message, self.moved_options)
            or _bad_choice(message)
            or _bad_type(message)
            or " ".join(line.strip() for line in message.splitlines() if line.strip())
        )
        prog = parser.prog.replace(" [options]", "").replace("__main__.py", "python -m project")
        exit_with(UserError(f"{detail[:600]} (see {prog} --help)"))


# How jsonargparse says a section has no such option: in a config file, or on the command line (a subsection's).
_UNKNOWN = (
    re.compile(r"Option '(?P<option>[^']+)' is not accepted"),
    re.compile(r"Group '(?P<group>[^']+)' does not accept option '(?P<option>[^']+)'"),
    re.compile(r"unrecognized arguments: --(?P<group>[\w.]+)\.(?P<option>\w+)[= ]"),
)


#: Options a layer adds (a section's key covers its options) -> the layer: unknown, they name the stripped layer.
LAYER_OPTIONS: Mapping[str, str] = MappingProxyType(
    {f"parallel.{key}": "lr" for key in ("learning_rate", "lr_scaling", "reference_batch_size", "warmup_steps")}
)


# Where jsonargparse's report names a class path it tried: "Problem with given class_path 'a.B'", a config file's
# {'class_path': 'a.B'}, --data.class_path's NestedArg(key='class_path', val='a.B'), --model's "a path but a.B".
_CLASS_PATHS = re.compile(
    r"class_path '(?P<a>[\w.]+)'|class_path['\"]: ['\"](?P<b>[\w.]+)|class_path', val='(?P<c>[\w.]+)'"
    r"|Expected a path but (?P<d>[\w.]+) either"
)


def class_path_failure(message: str, argv: list[str] | None = None) -> str | None:
    """A class path in jsonargparse's report that does not import, and why: "--model a.B: module a has no class B".

    jsonargparse reports it as a value of the wrong type ("model=... is not LightningModule"), hiding the import error.
    """
    for found in _CLASS_PATHS.finditer(message):
        path = next(group for group in found.groups() if group)
        failure = import_failure(path) if "." in path else None
        if failure is None:
            continue
        args = sys.argv[1:] if argv is None else argv
        given = [(a, b) for a, b in itertools.pairwise(args) if a.startswith("--") and "=" not in a]
        given += [tuple(a.split("=", 1)) for a in args if a.startswith("--") and "=" in a]
        flag = next((option for option, value in given if path in value and option != "--config"), None)
        if flag:
            return f"{flag} {path}: {failure}"
        keys = re.findall(r'Parser key "([^"]+)"', message[: found.start()])
        files = [f for f in _config_files(args) if path in f or path in _text_of(f)]
        where = "in a config file" if not files else "in --config" if path in files[-1] else f"in {files[-1]}"
        return f"{'.init_args.'.join(keys) or 'a'} class_path {path} ({where}): {failure}"
    return None


def _text_of(file: str) -> str:
    """A config file's text; "" for an inline config or a file that cannot be read."""
    try:
        return Path(file).read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _unknown_option(message: str, moved: Mapping[str, str]) -> str | None:
    """The gist of jsonargparse's page-long report on a nested class: "unknown option 'gpus' in parallel".

    An option that moved says where to: "parallel.sharding is now parallel.fsdp.sharding: write ...".
    """
    found = next((m for pattern in _UNKNOWN if (m := pattern.search(message))), None)
    keys = re.findall(r'Parser key "([^"]+)"', message[: found.start()]) if found else []
    if found is None or (found.re is _UNKNOWN[2] and not keys):
        return None  # a top-level unrecognized argument: the parser's own line says it
    option = found.group("option")
    where = ".".join([*keys, *([found.group("group")] if "group" in found.groupdict() else [])])
    key = f"{where}.{option}" if where else option
    if key in moved:
        new = moved[key]
        in_file = " under ".join(f"`{part}:`" for part in reversed(new.split(".")))
        return f"{key} is now {new}: write --{new} on the command line, or {in_file} in a config file"
    layer = next((layer for name, layer in LAYER_OPTIONS.items() if f"{key}.".startswith(f"{name}.")), None)
    if layer is not None:
        return f"{key} needs the {layer} layer (project/extras/{layer}), which this checkout does not have; remove it"
    # The name of another subsection's option: say where it is (parallel.ddp.sharding -> parallel.fsdp.sharding).
    elsewhere = [new for old, new in moved.items() if old.rpartition(".")[2] == option and new != key]
    said = f"unknown option '{option}'" + (f" in {where}" if where else "")
    return f"{said}; it is {elsewhere[0]}" if elsewhere else said


def _bad_choice(message: str) -> str | None:
    """A value outside a ``Literal``: "parallel.scenario='tpu' is not one of auto, cpu, single, dp, ddp"."""
    found = re.search(r"Expected a typing\.Literal\[([^\]]*)\]\. Got value: (\S+)", message)
    if found is None:
        return None
    keys = re.findall(r'Parser key "([^"]+)"', message[: found.start()])
    choices = ", ".join(choice.strip().strip("'\"") for choice in found.group(1).split(","))
    return f"{'.'.join(keys)}={found.group(2)!r} is not one of {choices}"


# How a value of each type is written on the command line, for "is not ..." in one line.
_TYPE_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "str": "text",
    "NoneType": "null",
    "list": "a list ([a, b])",
    "tuple": "a list ([a, b])",
    "dict": "a mapping ({key: value})",
}


def _bad_type(message: str) -> str | None:
    """A value of the wrong type: "parallel.micro_batch='abc' is not a whole number, 'auto' or null"."""
    keys = list(re.finditer(r'Parser key "([^"]+)"', message))
    tail = message[keys[-1].end() :] if keys else ""
    found = re.search(r"(?:Got|Given) value: (\S+)", tail)
    if found is None or found.group(1).startswith("NestedArg("):  # a nested section's own report: not a value
        return None
    # A union lists its types before "Errors:"; a plain type is "Expected" before the value (after: other types').
    expected = tail.split("Errors:")[0] if "Subtypes:" in tail[: found.start()] else tail[: found.start()]
    words: list[str] = []
    types = r"<class '(?:[\w.]+\.)?(\w+)'>|typing\.Literal\[([^\]]*)\]|\b(list|tuple|dict)\["
    for name, choices, generic in re.findall(types, expected):
        name = name or generic
        word = _TYPE_WORDS.get(name, name) if name else ", ".join(c.strip() for c in choices.split(","))
        if word not in words and word != "NestedArg":
            words.append(word)
    if not words:
        return None
    wanted = ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]
    key = _flag_of(keys[-1].group(1), found.group(1)) or ".".join(k.group(1) for k in keys)
    return f"{key}={found.group(1)!r} is not {wanted}; give {key} {wanted}"


def _flag_of(key: str, value: str) -> str | None:
    """The option as the user wrote it (``model.init_args.net.init_args.hidden``; the parser's keys drop init_args)."""
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        name, equals, given = arg.partition("=")
        given = given if equals else (args[i + 1] if i + 1 < len(args) else "")
        if name.startswith("--") and name.rpartition(".")[2] == key.rpartition(".")[2] and given == value:
            return name[2:]
    return None


def root_cause(error: BaseException) -> str:
    """The user's own message inside jsonargparse's nested 'Does not validate against any of...' report."""
    reasons = [line.strip()[2:] for line in str(error).splitlines() if line.strip().startswith("- ")]
    reasons = [r for r in reasons if not r.startswith("Expected a <class 'NoneType'>")]
    if reasons:
        return reasons[0]
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    if lines[0].endswith(":"):  # "Problem with given class_path 'x.Y':" and the class's own error below it
        inner = error.__cause__ or error.__context__
        lines[0] += f" {type(inner).__name__}: {inner}" if inner is not None else f" {' '.join(lines[1:2])}"
    return lines[0]


def _config_files(args: list[str]) -> list[str]:
    """The values of ``--config``/``-c`` on a command line, in order (a file's name or an inline config)."""
    found = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in ("-c", "--config")]
    return found + [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]


def check_config_files(args: list[str]) -> None:
    """Refuse a missing or unparsable ``--config`` file with its name, before LightningCLI reads it."""
    for value in _config_files(args):
        path = Path(value)
        if value.lstrip().startswith("{") or (not path.suffix and not path.exists()):
            continue  # an inline config, not a file
        if not path.is_file():
            raise UserError(f"config file '{value}' does not exist; check the path (it is read from {Path.cwd()})")
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise UserError(f"config file '{value}' is not valid YAML{where}: {problem}; fix the file") from error
