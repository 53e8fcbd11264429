"""The pins `make` installs with (`.ci/constraints.txt`, `.ci/constraints-spark40.txt`, pip's `-c`): each
venv's requirements all pinned, every pin within pyproject.toml's range, and the venvs installed at them."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]

VENVS = [  # (the venv, the Makefile's variable naming its extras, and its constraints file's)
    (".venv", "EXTRAS", "CONSTRAINTS"),
    (".venv-spark40", "EXTRAS40", "CONSTRAINTS40"),
]


def _makefile_variables() -> dict[str, str]:
    """The Makefile's simple assignments (``NAME := value``)."""
    found: dict[str, str] = {}
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Z0-9_]+)\s*:=\s*(\S+)\s*$", line)
        if match:
            found[match[1]] = match[2]
    return found


def _pins(path: Path) -> dict[NormalizedName, Version]:
    """``name==version`` per line of a constraints file, comments aside."""
    pins: dict[NormalizedName, Version] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, separator, version = line.partition("==")
        assert separator, f"{path.name}: {line!r} is not name==version"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def _requirements(extras: str) -> list[Requirement]:
    """The project's dependencies and those of ``extras`` (comma-separated) that apply on this machine."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in extras.split(","):
        texts += project["optional-dependencies"][extra]
    requirements = [Requirement(text) for text in texts]
    return [r for r in requirements if r.marker is None or r.marker.evaluate()]


@pytest.mark.parametrize(("venv", "extras_variable", "constraints_variable"), VENVS)
def test_every_requirement_is_pinned_within_its_range(
    venv: str, extras_variable: str, constraints_variable: str
) -> None:
    variables = _makefile_variables()
    pins = _pins(ROOT / variables[constraints_variable])
    assert "timestone" not in pins, "the project itself is installed from the checkout, never pinned"
    for requirement in _requirements(variables[extras_variable]):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} ({venv}) has no pin: make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside {requirement} ({venv}): make lock"
        )


@pytest.mark.parametrize(("venv", "constraints_variable"), [(venv, pins) for venv, _, pins in VENVS])
def test_each_venv_is_installed_at_its_pins(venv: str, constraints_variable: str) -> None:
    """`make test` builds both venvs before the suite runs: each package at the version pinned (so a release
    of a dependency, a linter's new style say, changes nothing until the pins are written again)."""
    pins = _pins(ROOT / _makefile_variables()[constraints_variable])
    site_packages = sorted((ROOT / venv).glob("lib/python*/site-packages"))
    assert site_packages, f"{venv} is not set up (make test builds it)"
    installed = {
        canonicalize_name(dist.metadata["Name"]): Version(dist.version)
        for dist in metadata.distributions(path=[str(path) for path in site_packages])
    }
    wrong = {
        name: (str(pin), str(installed.get(name))) for name, pin in pins.items() if installed.get(name) != pin
    }
    assert not wrong, f"{venv}: pinned and installed differ (pin, installed): {wrong}"
