"""The lock files in ``requirements/`` (written by ``./run lock``) match pyproject.toml,
pin every package with hashes, and are what the image and ``./run`` install.

Whether they are the newest resolution is not checked here (that needs the index):
``./run lock`` answers that. What is checked is that nobody added or tightened a
dependency in pyproject.toml without locking it again.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.ops.support import ROOT

REQUIREMENTS = ROOT / "requirements"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def pins(name: str) -> dict[str, str]:
    """Package -> pinned version of one lock file."""
    text = (REQUIREMENTS / name).read_text()
    return {canonicalize_name(match[1]): match[2] for match in _PIN.finditer(text)}


def entries(name: str) -> list[str]:
    """The lock file's requirement entries, each with its continuation lines."""
    text = (REQUIREMENTS / name).read_text()
    return [entry for entry in re.split(r"\n(?=\S)", text) if _PIN.match(entry)]


def _project() -> dict[str, object]:
    project: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def _check_satisfied(requirements: list[str], locked: dict[str, str]) -> None:
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate(
            {"python_version": "3.11"}
        ):
            continue
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{requirement.name} is not locked: run ./run lock"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"{requirement} but {locked[name]} is locked: run ./run lock"
        )


def test_the_runtime_lock_satisfies_the_dependencies() -> None:
    dependencies = _project()["dependencies"]
    assert isinstance(dependencies, list)
    _check_satisfied(dependencies, pins("runtime.txt"))


def test_the_test_lock_satisfies_the_dependencies_and_the_test_extra() -> None:
    project = _project()
    extras = project["optional-dependencies"]
    assert isinstance(extras, dict)
    dependencies = project["dependencies"]
    assert isinstance(dependencies, list)
    _check_satisfied([*dependencies, *extras["test"]], pins("test.txt"))


def test_the_build_lock_satisfies_the_build_backend() -> None:
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    _check_satisfied(build, pins("build.txt"))


def test_runtime_and_test_locks_name_the_same_versions() -> None:
    runtime, test = pins("runtime.txt"), pins("test.txt")
    assert {name: version for name, version in test.items() if name in runtime} == runtime


@pytest.mark.parametrize("name", ["build.txt", "runtime.txt", "test.txt"])
def test_every_locked_package_has_hashes(name: str) -> None:
    found = entries(name)
    assert found, f"{name} locks nothing"
    for entry in found:
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), entry.splitlines()[0]


def test_the_image_and_run_install_from_the_locks_with_hashes() -> None:
    dockerfile = " ".join((ROOT / "Dockerfile").read_text().replace("\\\n", " ").split())
    for lock in ("requirements/build.txt", "requirements/runtime.txt"):
        assert re.search(rf"pip install [^&]*--require-hashes [^&]*-r {lock}", dockerfile), lock
    # The package itself goes in without resolving anything again.
    assert "--no-deps --no-build-isolation" in dockerfile
    run = " ".join((ROOT / "run").read_text().replace("\\\n", " ").split())
    assert re.search(r"pip\" install --quiet --require-hashes [^\n]*requirements/test.txt", run)
    assert '--no-deps --no-build-isolation -e "$here"' in run


def test_the_requirements_are_in_the_image_build_context() -> None:
    patterns = (ROOT / ".dockerignore").read_text().splitlines()
    assert {"!requirements/build.txt", "!requirements/runtime.txt"} <= set(patterns)


def test_each_lock_file_says_how_it_is_refreshed() -> None:
    for path in sorted(Path(REQUIREMENTS).glob("*.txt")):
        assert "./run lock" in path.read_text().splitlines()[1], path.name
