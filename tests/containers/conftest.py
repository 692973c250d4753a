"""Session fixtures of the container tests: a Docker engine and the images, built once.

The engine is the one that answers, or the project's own dockerd (root on Debian,
``ordered_dev.devcluster.docker_engine``), stopped when the session ends, whatever the
outcome. Both images are built by ``ordered_dev.devcluster.images`` as ``./run image``
builds them: without a registry, from locally made Debian bases. What the tests
measured (image sizes, container start-to-ready times, build times) is printed in the
terminal summary.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ordered_dev.devcluster.docker_engine import Engine, docker_engine
from ordered_dev.devcluster.images import BuiltImage, build_servers_image, build_sidecar_image

MEASURED: dict[str, str] = {}
"""What the container tests measured, by name, for the terminal summary."""


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    with docker_engine() as answering:
        yield answering


@pytest.fixture(scope="session")
def sidecar_image(engine: Engine) -> BuiltImage:
    image = build_sidecar_image()
    MEASURED["sidecar image"] = f"{image.tag}, {image.size_bytes / 1e6:.0f} MB"
    MEASURED["sidecar image build"] = f"{image.seconds:.1f} s"
    return image


@pytest.fixture(scope="session")
def servers_image(engine: Engine) -> BuiltImage:
    image = build_servers_image()
    MEASURED["test servers image"] = f"{image.tag}, {image.size_bytes / 1e6:.0f} MB"
    MEASURED["test servers image build"] = f"{image.seconds:.1f} s"
    return image


_SPENT_S: list[float] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Setup, call and teardown of every container test: with the session fixtures
    # (engine, image builds, the docker cluster) this is what they add to a run.
    if report.nodeid.startswith("tests/containers/"):
        _SPENT_S.append(report.duration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MEASURED:
        terminalreporter.section("containers: measured")
        for name, value in MEASURED.items():
            terminalreporter.write_line(f"{name}: {value}")
        terminalreporter.write_line(f"time in tests/containers: {sum(_SPENT_S):.0f} s")
