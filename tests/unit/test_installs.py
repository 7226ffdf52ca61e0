"""What is installed: the tested versions, from hash-checked locks, and never a release known to be malicious."""

from __future__ import annotations

import importlib.util
import re
from datetime import date
from functools import cache
from importlib.metadata import version

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers import REPO

# lightning 2.6.2 and 2.6.3 were malicious releases (pulled from PyPI); never install or run on them.
MALICIOUS = {"lightning": {"2.6.2", "2.6.3"}, "pytorch-lightning": {"2.6.2", "2.6.3"}}

REQUIREMENTS = REPO / "requirements"
# The Makefile's install sets: each lock and the extras of pyproject.toml it is compiled from (`make lock`).
LOCK_EXTRAS = {
    "lock.txt": ("dev",),
    "lock-test.txt": ("dev", "ray", "tracking", "sweep", "storage", "storage-server"),
    "lock-audit.txt": ("dev", "ray", "tracking", "sweep", "storage", "storage-server", "audit"),
}
LOCKS = [*LOCK_EXTRAS, "lock-pip.txt"]
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)$")
HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")


@cache
def entries(lock: str) -> dict[str, tuple[str, list[str]]]:
    """A lock's requirements, continuation lines joined: canonical name -> (requirement, its options)."""
    text = re.sub(r"\\\n", " ", (REQUIREMENTS / lock).read_text(encoding="utf-8"))
    found = {}
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            found[canonicalize_name(re.split(r"[=<>!~\[; ]", words[0])[0])] = (words[0], words[1:])
    return found


def pins(lock: str) -> dict[str, str]:
    return {name: PIN.match(requirement)["version"] for name, (requirement, _) in entries(lock).items()}


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_no_known_malicious_release_is_installed_or_allowed():
    for package, bad in MALICIOUS.items():
        try:
            installed = version(package)
        except Exception:  # not installed at all
            continue
        assert installed not in bad, f"{package}=={installed} is a known malicious release: reinstall (make setup)"
    pinned = pyproject()["dependencies"]
    lightning = next(spec for spec in pinned if spec.startswith("lightning"))
    assert lightning.startswith("lightning==") and lightning.split("==")[1] not in MALICIOUS["lightning"]
    for lock in LOCKS:
        for package, bad in MALICIOUS.items():
            assert pins(lock).get(package) not in bad, f"requirements/{lock} pins a known malicious {package}"


@pytest.mark.parametrize("lock", LOCKS)
def test_lock_pins_every_package_with_hashes(lock):
    assert entries(lock), f"requirements/{lock} lists nothing"
    for name, (requirement, options) in entries(lock).items():
        assert PIN.match(requirement), f"requirements/{lock}: {requirement!r} is not pinned with =="
        assert options and all(HASH.match(option) for option in options), f"requirements/{lock}: {name} hashes"


@pytest.mark.parametrize("lock", LOCKS)
def test_torch_is_in_no_lock(lock):
    # torch comes from the Makefile's TORCH_SPEC alone (a local CPU wheel here; any other spec pulls a CUDA build):
    # a lock must never make pip resolve it, and CUDA's libraries in a lock would mean it was resolved for CUDA.
    names = set(entries(lock))
    assert "torch" not in names, f"requirements/{lock} lists torch"
    cuda = sorted(name for name in names if name.startswith(("nvidia-", "cuda-")) or name == "triton")
    assert not cuda, f"requirements/{lock} was resolved against a CUDA torch: {cuda}"


@pytest.mark.parametrize("lock", LOCK_EXTRAS)
def test_lock_pins_what_pyproject_names(lock):
    project = pyproject()
    named = list(project["dependencies"])
    for extra in LOCK_EXTRAS[lock]:
        named += project["optional-dependencies"].get(extra, [])  # a stripped layer's extra is gone (make strip)
    locked = pins(lock)
    for spec in map(Requirement, named):
        name = canonicalize_name(spec.name)
        if name == "torch":
            continue
        assert name in locked, f"pyproject.toml names {spec} but requirements/{lock} lacks it: make lock"
        assert spec.specifier.contains(locked[name], prereleases=True), (
            f"pyproject.toml says {spec}, requirements/{lock} pins {name}=={locked[name]}: make lock"
        )
        if [s.operator for s in spec.specifier] == ["=="]:
            assert locked[name] == next(iter(spec.specifier)).version, f"requirements/{lock}: {name}"


def test_lightning_lock_pin_is_pyproject_pin():
    wanted = next(Requirement(spec) for spec in pyproject()["dependencies"] if spec.startswith("lightning"))
    for lock in LOCK_EXTRAS:
        assert f"=={pins(lock)['lightning']}" == str(wanted.specifier), f"requirements/{lock}: lightning"


def test_locks_agree_with_each_other():
    # lock.txt (make setup) <= lock-test.txt (make test) <= lock-audit.txt (make audit), one version per package, so
    # that installing one set over another never changes a version (`make lock` constrains all to lock-audit.txt).
    union = pins("lock-audit.txt")
    assert set(pins("lock.txt")) <= set(pins("lock-test.txt")) <= set(union)
    for lock in LOCKS:
        differ = {name: (pinned, union.get(name)) for name, pinned in pins(lock).items() if union.get(name) != pinned}
        assert not differ, f"requirements/{lock} and lock-audit.txt disagree: {differ}"


def test_make_installs_from_the_locks_with_hashes():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    prerequisites = dict(re.findall(r"^\$\((\w+)\):(.*)$", makefile, re.MULTILINE))
    assert {"requirements/lock-pip.txt", "requirements/lock.txt"} <= set(prerequisites["STAMP"].split())
    assert "requirements/lock-test.txt" in prerequisites["TEST_STAMP"].split()
    assert "requirements/lock-audit.txt" in prerequisites["AUDIT_STAMP"].split()
    install = re.search(r"^INSTALL_LOCK := (.*)$", makefile, re.MULTILINE)[1].split()
    assert {"--require-hashes", "--no-deps"} <= set(install), install
    assert "pip install --quiet --no-deps --no-build-isolation -e ." in makefile


def test_listed_audit_findings_are_dated_explained_and_current():
    spec = importlib.util.spec_from_file_location("requirements_audit", REQUIREMENTS / "audit.py")
    audit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(audit)
    listed = audit.listed_advisories()
    assert ("CVE-2026-58659", "2026-12-04", "lightning==2.6.6") in [entry[:3] for entry in listed]
    for entry in listed:
        date.fromisoformat(entry.listed)
        assert len(entry.reason.split()) >= 4, f"{entry.advisory}: say why it is not counted"
        name, _, listed_version = entry.package.partition("==")
        # Listed for one version: an upgrade must re-check the advisory, not inherit the exception.
        assert pins("lock-audit.txt").get(canonicalize_name(name)) == listed_version, (
            f"requirements/audit-ignore.txt lists {entry.advisory} for {entry.package}, the lock pins another version"
        )
