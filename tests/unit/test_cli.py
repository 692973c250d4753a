"""``sidecar.cli``: which commands the parser has, and how ``main`` dispatches to them.

No command runs here: the handlers are replaced by recorders, and the optional commands
are probed with a throw-away package on ``sys.path``.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar import cli
from sidecar.commands import serve, topics

RUNTIME_COMMANDS = {"serve", "topics", "inject-webhook"}


def commands_of(parser: argparse.ArgumentParser) -> set[str]:
    found = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    assert len(found) == 1
    return set(found[0].choices)


class Recorder:
    """A command handler that keeps the arguments it was called with."""

    def __init__(self, result: int) -> None:
        self.result = result
        self.calls: list[argparse.Namespace] = []

    def __call__(self, args: argparse.Namespace) -> int:
        self.calls.append(args)
        return self.result


@pytest.fixture
def probe_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package with a working command module (``command``) and one whose own import
    fails on a dependency that is not installed (``needs_missing``)."""
    name = f"cli_probe_{uuid.uuid4().hex[:8]}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "command.py").write_text(
        "def add_parser(subparsers):\n"
        "    probe = subparsers.add_parser('probe')\n"
        "    probe.add_argument('--level', type=int, default=1)\n"
        "    probe.set_defaults(handler=lambda args: 40 + args.level)\n"
    )
    (package / "needs_missing.py").write_text(f"import {name}_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]


# The parser ---------------------------------------------------------------------------------


def test_the_program_is_called_sidecar() -> None:
    assert cli.build_parser().prog == "sidecar"


def test_the_runtime_commands_are_there_without_the_optional_packages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "_OPTIONAL_COMMANDS", ())
    assert commands_of(cli.build_parser()) == RUNTIME_COMMANDS


def test_the_installed_optional_packages_add_their_commands() -> None:
    # This checkout installs ordered_audit and ordered_dev (the image does not).
    assert commands_of(cli.build_parser()) == RUNTIME_COMMANDS | {
        "audit",
        "demo",
        "devcluster",
        "image",
    }


def test_an_optional_package_that_is_not_installed_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = f"cli_absent_{uuid.uuid4().hex[:8]}.command"
    monkeypatch.setattr(cli, "_OPTIONAL_COMMANDS", (missing,))
    assert commands_of(cli.build_parser()) == RUNTIME_COMMANDS


def test_an_installed_optional_package_adds_its_command(
    monkeypatch: pytest.MonkeyPatch, probe_package: str
) -> None:
    monkeypatch.setattr(cli, "_OPTIONAL_COMMANDS", (f"{probe_package}.command",))
    assert commands_of(cli.build_parser()) == RUNTIME_COMMANDS | {"probe"}
    assert cli.main(["probe", "--level", "2"]) == 42


def test_an_installed_package_missing_a_dependency_is_an_error_not_a_skip(
    monkeypatch: pytest.MonkeyPatch, probe_package: str
) -> None:
    # Skipping would hide a broken installation behind a missing command.
    monkeypatch.setattr(cli, "_OPTIONAL_COMMANDS", (f"{probe_package}.needs_missing",))
    with pytest.raises(ModuleNotFoundError) as raised:
        cli.build_parser()
    assert raised.value.name == f"{probe_package}_missing_dependency"


def test_a_missing_module_of_an_installed_optional_package_is_an_error(
    monkeypatch: pytest.MonkeyPatch, probe_package: str
) -> None:
    # Only a package that is not installed at all is left out: a command module the
    # installed copy does not have is a broken installation, said at once.
    monkeypatch.setattr(
        cli, "_OPTIONAL_COMMANDS", (f"{probe_package}.renamed_away", f"{probe_package}.command")
    )
    with pytest.raises(ModuleNotFoundError) as raised:
        cli.build_parser()
    assert raised.value.name == f"{probe_package}.renamed_away"


# Dispatch -----------------------------------------------------------------------------------


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([])
    assert exited.value.code == 2
    assert "required: command" in capsys.readouterr().err


def test_an_unknown_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["server"])
    assert exited.value.code == 2
    assert "invalid choice: 'server'" in capsys.readouterr().err


def test_serve_dispatches_to_run_serve_and_returns_its_exit_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler = Recorder(result=7)
    monkeypatch.setattr(serve, "run_serve", handler)
    assert cli.main(["serve", "--config", "/etc/sidecar/sidecar.toml"]) == 7
    [args] = handler.calls
    assert args.command == "serve"
    assert args.config == Path("/etc/sidecar/sidecar.toml")


def test_serve_without_a_config_file_reads_the_environment_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler = Recorder(result=0)
    monkeypatch.setattr(serve, "run_serve", handler)
    assert cli.main(["serve"]) == 0
    assert handler.calls[0].config is None


def test_topics_dispatches_to_run_topics_with_its_action(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler = Recorder(result=1)
    monkeypatch.setattr(topics, "run_topics", handler)
    argv = ["topics", "--url", "http://10.0.0.5:8082", "expand", "orders", "--to", "6"]
    assert cli.main(argv) == 1
    [args] = handler.calls
    assert (args.command, args.action, args.topic, args.count) == ("topics", "expand", "orders", 6)
    assert args.url == "http://10.0.0.5:8082"


def test_running_the_module_exits_with_the_handlers_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ``python -m sidecar.cli`` is what the demo runs when no ``sidecar`` script exists.
    handler = Recorder(result=3)
    monkeypatch.setattr(serve, "run_serve", handler)
    monkeypatch.setattr(sys, "argv", ["sidecar", "serve"])
    with warnings.catch_warnings():
        # runpy warns that sidecar.cli is imported already; it runs a fresh copy anyway.
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(SystemExit) as exited:
            runpy.run_module("sidecar.cli", run_name="__main__")
    assert exited.value.code == 3
    assert len(handler.calls) == 1
