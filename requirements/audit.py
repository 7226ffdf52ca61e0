"""`make audit`: pip-audit over this environment, the advisories listed in audit-ignore.txt not counted.

Run with the environment's own Python (the Makefile does: `.venv/bin/python requirements/audit.py [pip-audit args]`).
Exit 0: no finding, or the advisory service could not be reached (one note line: nothing was checked).
Exit 1: a finding that audit-ignore.txt does not list, or pip-audit failed for another reason (its error shown).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NamedTuple

IGNORE_FILE = Path(__file__).with_name("audit-ignore.txt")
# pip-audit stopped without a report because the service did not answer: DNS, refused, timeout, an HTTP error.
UNREACHABLE = re.compile(
    r"ConnectionError|ConnectTimeout|ReadTimeout|Max retries exceeded|NameResolutionError|Failed to resolve|"
    r"ServiceError|Could not connect|not redirecting|network may be blocking",
)
# pip-audit's skip reason for a package the service has no answer for (PyPI's JSON API: 404).
NOT_ANSWERED = "could not be audited"


class Listed(NamedTuple):
    """One line of audit-ignore.txt."""

    advisory: str
    listed: str
    package: str
    reason: str


def listed_advisories(path: Path = IGNORE_FILE) -> list[Listed]:
    """The advisories audit-ignore.txt lists, one per line that is not blank or a comment."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Listed(*line.split(maxsplit=3)) for line in lines if line.strip() and not line.startswith("#")]


def _installed(spec: str) -> bool:
    name, _, wanted = spec.partition("==")
    try:
        return version(name) == wanted
    except PackageNotFoundError:
        return False


def main(argv: list[str]) -> int:
    """Run pip-audit, print its findings and notes, and return the exit code (see the module's docstring)."""
    listed = listed_advisories()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "audit.json"
        command = [sys.executable, "-m", "pip_audit", "--skip-editable", "--progress-spinner", "off"]
        command += ["--format", "json", "--output", str(report), *(f"--ignore-vuln={e.advisory}" for e in listed)]
        done = subprocess.run([*command, *argv], capture_output=True, text=True, check=False)
        if not report.exists():
            failure = UNREACHABLE.search(done.stderr)
            if failure:
                host = re.search(r"host='([^']+)'", done.stderr)
                cause = f"{failure.group()} from {host.group(1)}" if host else failure.group()
                print(f"note: audit skipped, the advisory service could not be reached ({cause}); nothing checked")
                return 0
            sys.stderr.write(done.stderr)
            return done.returncode or 1
        dependencies = json.loads(report.read_text(encoding="utf-8"))["dependencies"]
    audited = [dep for dep in dependencies if "vulns" in dep]
    unanswered = [dep["name"] for dep in dependencies if NOT_ANSWERED in dep.get("skip_reason", "")]
    if not audited:
        print(
            f"note: audit skipped, the advisory service had no answer for any of the {len(unanswered)} installed "
            "packages (not reachable from here); nothing checked"
        )
        return 0
    findings = [(dep, vuln) for dep in audited for vuln in dep["vulns"]]
    for dep, vuln in findings:
        aliases = ", ".join(sorted(vuln.get("aliases", [])))
        fixed = ", ".join(vuln["fix_versions"]) or "no fixed release"
        print(f"{dep['name']}=={dep['version']}: {vuln['id']} ({aliases}), fixed in: {fixed}")
    if unanswered:
        print(f"note: not audited, unknown to the advisory service: {', '.join(unanswered)}")
    for entry in listed:
        state = "" if _installed(entry.package) else f" (stale: {entry.package} is not installed)"
        print(f"not counted: {entry.advisory} for {entry.package}, listed {entry.listed}: {entry.reason}{state}")
    print(f"audit: {len(audited)} packages audited, {len(findings)} unexplained finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
