"""The README and the manual in docs/: size, links and anchors, the commands and make targets they name.

Pure file reading (no subprocess, no import of the CLI): the commands are read from ``project/commands.py`` by ``ast``.
"""

from __future__ import annotations

import itertools
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from helpers import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md")) + sorted(DOCS.glob("extras/*.md"))  # the layers' pages too
MARKDOWN = [README, *PAGES]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
PROJECT_COMMAND = re.compile(r"(?:^|\s)-m\s+project\s+(\S+)")
MAKE = re.compile(r"(?:^|[\s;&|(])make\s+((?:[\w.-]+=\S*\s+)*)([A-Za-z][\w.-]*)")


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def _lines(path: Path) -> list[tuple[str | None, str]]:
    """Each line with the info string of the fenced block it is in (None outside fences, fence lines dropped)."""
    out: list[tuple[str | None, str]] = []
    fence: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fence = line.strip().lstrip("`~").strip() if fence is None else None
            continue
        out.append((fence, line))
    return out


def _prose(path: Path) -> list[str]:
    """The lines outside fenced code blocks, inline code removed (links inside code spans are not links)."""
    return [INLINE_CODE.sub("", line) for fence, line in _lines(path) if fence is None]


def _code(path: Path) -> list[str]:
    """Every piece of code: the lines of fenced blocks and each inline code span."""
    spans = []
    for fence, line in _lines(path):
        if fence is None:
            spans += [match.group(2) for match in INLINE_CODE.finditer(line)]
        else:
            spans.append(line)
    return spans


def _bash_commands(path: Path) -> list[str]:
    """The commands of ```bash blocks, continuation lines joined."""
    commands, current = [], ""
    for fence, line in _lines(path):
        if fence not in ("bash", "sh", "shell", "console"):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            commands.append(current.strip())
        current = ""
    return commands


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for fence, line in _lines(path):
        match = HEADING.match(line) if fence is None else None
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def _links(path: Path) -> list[str]:
    return [match.group(1) for line in _prose(path) for match in LINK.finditer(line)]


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)


@cache
def project_commands() -> frozenset[str]:
    """The names of ``project.commands.COMMANDS`` (the command table: standard library only, no Lightning import)."""
    from project.commands import COMMANDS

    return frozenset(COMMANDS)


@cache
def make_targets() -> frozenset[str]:
    targets = set()
    for line in (REPO / "Makefile").read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.%/ -]+?)\s*::?(?!=)", line)
        if match and not line.startswith("\t"):
            targets.update(name for name in match.group(1).split() if not name.startswith("."))
    return frozenset(targets)


def test_there_is_a_manual():
    names = {page.name for page in PAGES}
    assert {"index.md", "adding-a-scenario.md"} <= names, names
    assert {"train", "test", "setup"} <= make_targets(), sorted(make_targets())
    assert "fit" in project_commands() and "plan" in project_commands(), sorted(project_commands())


def test_readme_is_short_and_links_every_docs_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move sections to docs/ (at most 200)"
    linked = {(README.parent / target.split("#")[0]).resolve() for target in _links(README) if _relative(target)}
    missing = [_name(page) for page in PAGES if page.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_docs_index_links_every_page():
    index = DOCS / "index.md"
    linked = {(DOCS / target.split("#")[0]).resolve() for target in _links(index) if _relative(target)}
    missing = [_name(page) for page in PAGES if page != index and page.resolve() not in linked]
    assert not missing, f"docs/index.md does not link {missing}"


def test_slug_follows_githubs_rule():
    assert slug("FSDP: sharded parameters, gradients and optimizer state") == (
        "fsdp-sharded-parameters-gradients-and-optimizer-state"
    )
    assert slug("Resuming: `--resume auto`") == "resuming---resume-auto"
    assert slug("`BarrierCallback`: the seed's `synchronize()`") == "barriercallback-the-seeds-synchronize"
    assert slug("What each process will do: `plan` and `plan.json`") == "what-each-process-will-do-plan-and-planjson"


@pytest.mark.parametrize("path", MARKDOWN, ids=_name)
def test_relative_links_and_anchors_exist(path):
    broken = []
    for target in _links(path):
        if not _relative(target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {_name(resolved)}")
    assert not broken, f"{_name(path)}: {broken}"


@pytest.mark.parametrize("path", MARKDOWN, ids=_name)
def test_project_commands_in_bash_blocks_exist_with_their_configs(path):
    commands, problems = project_commands(), []
    for line in _bash_commands(path):
        if not PROJECT_COMMAND.search(line):
            continue
        words = shlex.split(line, comments=True)
        at = next(i for i, (a, b) in enumerate(itertools.pairwise(words)) if a == "-m" and b == "project")
        command = words[at + 2] if len(words) > at + 2 else ""
        if command not in commands and command not in ("--help", "-h"):
            problems.append(f"{command!r} is not one of {sorted(commands)}: {line}")
        rest = words[at + 2 :]
        configs = [b for a, b in itertools.pairwise(rest) if a == "--config"]
        configs += [word.split("=", 1)[1] for word in rest if word.startswith("--config=")]
        for config in configs:
            if config.startswith(("configs/", "tests/")) and not (REPO / config).is_file():
                problems.append(f"--config {config} does not exist: {line}")
    assert not problems, f"{_name(path)}: {problems}"


def test_bash_blocks_name_project_commands():
    # The check above must see the commands it is meant to check.
    found = [line for path in MARKDOWN for line in _bash_commands(path) if PROJECT_COMMAND.search(line)]
    assert len(found) >= 5, found


@pytest.mark.parametrize("path", MARKDOWN, ids=_name)
def test_make_targets_exist(path):
    targets = make_targets()
    named = {match.group(2) for code in _code(path) for match in MAKE.finditer(code)}
    missing = sorted(named - targets)
    assert not missing, f"{_name(path)} names make targets the Makefile lacks: {missing}"


def test_a_layers_page_links_no_other_layers_page():
    """docs/extras/<layer>.md may link the core's pages (``../``), not another layer's, which a strip may remove."""
    found = [
        f"{_name(page)}: {target}"
        for page in sorted(DOCS.glob("extras/*.md"))
        for line in page.read_text(encoding="utf-8").splitlines()
        if "<!-- extras:" not in line  # a marked line goes with the layer it names
        for target in (match.group(1) for match in LINK.finditer(line))
        if _relative(target) and not target.startswith(("../", "#")) and target.split("#")[0] != page.name
    ]
    assert not found, found
