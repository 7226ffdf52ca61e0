"""What is installed: the tested versions, and never a release known to be malicious."""

from __future__ import annotations

from importlib.metadata import version

import tomllib

from helpers import REPO

# lightning 2.6.2 and 2.6.3 were malicious releases (pulled from PyPI); never install or run on them.
MALICIOUS = {"lightning": {"2.6.2", "2.6.3"}, "pytorch-lightning": {"2.6.2", "2.6.3"}}


def test_no_known_malicious_release_is_installed_or_allowed():
    for package, bad in MALICIOUS.items():
        try:
            installed = version(package)
        except Exception:  # not installed at all
            continue
        assert installed not in bad, f"{package}=={installed} is a known malicious release: reinstall (make setup)"
    pinned = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    lightning = next(spec for spec in pinned if spec.startswith("lightning"))
    assert lightning.startswith("lightning==") and lightning.split("==")[1] not in MALICIOUS["lightning"]
