"""requirements.lock pins every dependency, and the tests run on exactly those versions.

scripts/run.sh, scripts/test.sh and the Dockerfile install with `-c requirements.lock`; `bash
scripts/lock.sh` refreshes it. A dependency added to pyproject.toml without refreshing the lock, or a
pin outside the range pyproject.toml allows, fails here; so does an environment that drifted from it.
"""

from __future__ import annotations

import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.paths import REPO


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version and ";" not in line, f"requirements.lock: not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = version
    return pins


def test_every_dependency_and_dev_tool_is_pinned_within_its_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for spec in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements.lock: run bash scripts/lock.sh"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"requirements.lock pins {req.name}=={pins[name]}, outside pyproject.toml's {req.specifier}"
    # kombu's transport internals are subclassed (service/redis_transport.py, service/embedded.py): its next
    # minor release is taken only on purpose
    kombu = [r for r in map(Requirement, project["dependencies"]) if canonicalize_name(r.name) == "kombu"]
    assert kombu and kombu[0].specifier.contains("5.7.0") and not kombu[0].specifier.contains("5.8.0"), kombu


def test_the_environment_is_the_locked_one() -> None:
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    drifted = {n: (v, installed.get(n)) for n, v in _pins().items() if installed.get(n) != v}
    assert not drifted, ("installed versions differ from requirements.lock (locked, installed): "
                         f"{drifted}; reinstall with scripts/test.sh's pip install -c requirements.lock")
