"""``sidecar.commands.serve``: the ``serve`` subcommand, its exit statuses, and the run
loop (ready line, signals, graceful stop).

No sidecar starts: ``run_serve`` is tested with ``serve`` replaced by a recorder, and
``serve`` with ``SidecarServer`` replaced by a scripted fake. ``serve`` runs in its own
``asyncio.run`` loop, as the command does, so its signal handlers go with that loop.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sidecar.commands import serve
from sidecar.commands.serve import tune_process
from sidecar.config import ConfigError, LogSettings, ProcessSettings, Settings
from sidecar.core.errors import KafkaAuthenticationFailed, KafkaUnavailable, SidecarError

URL = "http://127.0.0.1:18082"


@pytest.fixture(autouse=True)
def no_sidecar_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from the test's file only, not from the machine's environment."""
    for name in list(os.environ):
        if name.startswith("ORDERED_SIDECAR"):
            monkeypatch.delenv(name)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sidecar")
    serve.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.toml"
    path.write_text(text)
    return path


# The subcommand -----------------------------------------------------------------------------


def test_serve_takes_an_optional_config_path_and_runs_run_serve() -> None:
    args = parse(["serve", "--config", "conf/sidecar.toml"])
    assert args.config == Path("conf/sidecar.toml")
    assert args.handler is serve.run_serve
    assert parse(["serve"]).config is None


def test_serve_takes_no_positional_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["serve", "extra"])
    assert exited.value.code == 2
    assert "unrecognized arguments: extra" in capsys.readouterr().err


# run_serve: exit statuses -------------------------------------------------------------------


@dataclass
class Calls:
    """What run_serve did, in order, with what."""

    order: list[str] = field(default_factory=list)
    served: list[Settings] = field(default_factory=list)
    logging: list[LogSettings] = field(default_factory=list)
    process: list[ProcessSettings] = field(default_factory=list)
    raises: BaseException | None = None


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Replace logging set-up, process tuning and the run loop with recorders: the
    first two change the whole test process, the last would start a sidecar."""
    recorded = Calls()

    def configure_logging(settings: LogSettings) -> None:
        recorded.order.append("logging")
        recorded.logging.append(settings)

    def tune_process(settings: ProcessSettings) -> None:
        recorded.order.append("process")
        recorded.process.append(settings)

    async def fake_serve(settings: Settings) -> None:
        recorded.order.append("serve")
        recorded.served.append(settings)
        if recorded.raises is not None:
            raise recorded.raises

    monkeypatch.setattr(serve, "configure_logging", configure_logging)
    monkeypatch.setattr(serve, "tune_process", tune_process)
    monkeypatch.setattr(serve, "serve", fake_serve)
    return recorded


def test_a_graceful_stop_exits_0_after_setting_up_logging_and_the_process(
    tmp_path: Path, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(
        tmp_path,
        'sidecar_id = "from-file"\n[log]\nlevel = "DEBUG"\n[process]\ngc_young_threshold = 20000\n',
    )
    assert serve.run_serve(parse(["serve", "--config", str(path)])) == 0
    # Logging first: the server's start already logs.
    assert calls.order == ["logging", "process", "serve"]
    [settings] = calls.served
    assert settings.sidecar_id == "from-file"
    assert calls.logging == [LogSettings(level="DEBUG")]
    assert calls.process == [ProcessSettings(gc_young_threshold=20_000)]
    assert capsys.readouterr().err == ""


def test_the_environment_overrides_the_config_file(
    tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path, 'sidecar_id = "from-file"\n')
    monkeypatch.setenv("ORDERED_SIDECAR__SIDECAR_ID", "from-env")
    assert serve.run_serve(parse(["serve", "--config", str(path)])) == 0
    assert calls.served[0].sidecar_id == "from-env"


def test_without_a_config_file_the_settings_come_from_the_environment(
    calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORDERED_SIDECAR__SIDECAR_ID", "env-only")
    monkeypatch.setenv("ORDERED_SIDECAR__HTTP__PORT", "9100")
    assert serve.run_serve(parse(["serve"])) == 0
    assert (calls.served[0].sidecar_id, calls.served[0].http.port) == ("env-only", 9100)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("[http]\nport = 70000\n", "sidecar: http.port must be between 0 and 65535, got 70000\n"),
        ("[nope]\nx = 1\n", "sidecar: unknown configuration section 'nope'\n"),
    ],
    ids=["bad-value", "unknown-section"],
)
def test_a_bad_setting_exits_2_with_one_line_before_anything_starts(
    tmp_path: Path, calls: Calls, capsys: pytest.CaptureFixture[str], text: str, line: str
) -> None:
    path = write_config(tmp_path, text)
    assert serve.run_serve(parse(["serve", "--config", str(path)])) == 2
    assert calls.order == []
    assert capsys.readouterr() == ("", line)


def test_a_missing_config_file_exits_2_naming_it(
    tmp_path: Path, calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "absent.toml"
    assert serve.run_serve(parse(["serve", "--config", str(missing)])) == 2
    assert calls.order == []
    err = capsys.readouterr().err
    assert err.startswith(f"sidecar: cannot read configuration file {missing}:")
    assert err.count("\n") == 1


def test_a_port_that_cannot_be_bound_exits_2_with_one_line(
    calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    calls.raises = ConfigError("http.port: cannot listen on 127.0.0.1:8082: Address in use")
    assert serve.run_serve(parse(["serve"])) == 2
    assert capsys.readouterr() == (
        "",
        "sidecar: http.port: cannot listen on 127.0.0.1:8082: Address in use\n",
    )


def test_an_identity_the_cluster_refuses_exits_2_with_one_line(
    calls: Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    calls.raises = KafkaAuthenticationFailed(
        "kafka.security.sasl_username / kafka.security.sasl_password: refused"
    )
    assert serve.run_serve(parse(["serve"])) == 2
    assert capsys.readouterr() == (
        "",
        "sidecar: cannot start: kafka.security.sasl_username / "
        "kafka.security.sasl_password: refused\n",
    )


def test_an_error_that_is_not_fatal_at_start_is_not_turned_into_an_exit_status(
    calls: Calls,
) -> None:
    # Only a refused identity is an expected way to end; anything else keeps its traceback.
    calls.raises = KafkaUnavailable("no broker")
    with pytest.raises(KafkaUnavailable, match="no broker"):
        serve.run_serve(parse(["serve"]))


def test_an_unexpected_error_propagates(calls: Calls) -> None:
    calls.raises = RuntimeError("bug")
    with pytest.raises(RuntimeError, match="bug"):
        serve.run_serve(parse(["serve"]))


# serve: the run loop ------------------------------------------------------------------------


@dataclass
class Script:
    """How the fake server behaves, and what happened to it."""

    start_error: BaseException | None = None
    ready_error: SidecarError | None = None
    never_ready: bool = False
    signal_after_start: signal.Signals | None = None
    signal_after_ready: signal.Signals | None = None
    events: list[str] = field(default_factory=list)
    settings: list[Settings] = field(default_factory=list)


def raise_signal_safely(events: list[str], sig: signal.Signals) -> None:
    # Without serve's handler this signal would end the test process: refuse instead.
    if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
        raise AssertionError(f"no handler for {sig.name} is installed")
    events.append(sig.name)
    signal.raise_signal(sig)


class FakeServer:
    def __init__(self, settings: Settings, script: Script) -> None:
        script.settings.append(settings)
        self.script = script
        self.url = URL

    async def start(self) -> None:
        self.script.events.append("start")
        if self.script.start_error is not None:
            raise self.script.start_error
        if self.script.signal_after_start is not None:
            asyncio.get_running_loop().call_later(
                0.01, raise_signal_safely, self.script.events, self.script.signal_after_start
            )

    async def wait_ready(self) -> None:
        if self.script.never_ready:
            await asyncio.Event().wait()
        if self.script.ready_error is not None:
            self.script.events.append("gave up")
            raise self.script.ready_error
        self.script.events.append("ready")
        if self.script.signal_after_ready is not None:
            asyncio.get_running_loop().call_later(
                0.01, raise_signal_safely, self.script.events, self.script.signal_after_ready
            )

    async def stop(self) -> None:
        self.script.events.append("stop")


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Iterator[Script]:
    scripted = Script()

    def build(settings: Settings) -> Any:
        return FakeServer(settings, scripted)

    monkeypatch.setattr(serve, "SidecarServer", build)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield scripted
    # serve's handlers belong to its loop, which asyncio.run closed: asyncio puts back
    # the default handlers (SIGINT's is Python's own), not serve's. Whatever another
    # test had installed before is restored for the tests after this one.
    try:
        assert signal.getsignal(signal.SIGTERM) in (before[signal.SIGTERM], signal.SIG_DFL)
        assert signal.getsignal(signal.SIGINT) in (
            before[signal.SIGINT],
            signal.default_int_handler,
        )
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def run(settings: Settings) -> None:
    asyncio.run(asyncio.wait_for(serve.serve(settings), timeout=10))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_once_ready_it_prints_one_line_and_runs_until_a_signal_then_stops(
    script: Script, capsys: pytest.CaptureFixture[str], sig: signal.Signals
) -> None:
    script.signal_after_ready = sig
    settings = Settings(sidecar_id="s1")
    run(settings)
    assert script.settings == [settings]
    assert script.events == ["start", "ready", sig.name, "stop"]
    out = capsys.readouterr().out
    assert out == f"sidecar s1 ready on {URL}\n"
    # Scripts read the URL as the line's last word.
    assert out.split()[-1] == URL


def test_a_signal_before_ready_stops_the_server_without_a_ready_line(
    script: Script, capsys: pytest.CaptureFixture[str]
) -> None:
    script.never_ready = True
    script.signal_after_start = signal.SIGTERM
    run(Settings(sidecar_id="s1"))
    assert script.events == ["start", "SIGTERM", "stop"]
    assert capsys.readouterr().out == ""


def test_a_start_that_gives_up_stops_the_server_and_raises_its_error(
    script: Script, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = KafkaAuthenticationFailed("kafka.security.sasl_password: refused")
    script.ready_error = refused
    with pytest.raises(KafkaAuthenticationFailed) as raised:
        run(Settings(sidecar_id="s1"))
    assert raised.value is refused
    assert script.events == ["start", "gave up", "stop"]
    assert capsys.readouterr().out == ""


def test_a_port_that_cannot_be_bound_is_raised_from_start(
    script: Script, capsys: pytest.CaptureFixture[str]
) -> None:
    script.start_error = ConfigError("http.ops_port: cannot listen on 127.0.0.1:8081: in use")
    with pytest.raises(ConfigError, match=r"^http\.ops_port: "):
        run(Settings(sidecar_id="s1"))
    assert script.events[0] == "start"
    assert "ready" not in script.events
    assert capsys.readouterr().out == ""


# The event loop (process.event_loop) ------------------------------------------------------


def test_asyncio_is_asyncios_own_loop() -> None:
    assert serve.event_loop_factory("asyncio") is None


@pytest.mark.parametrize("choice", ["auto", "uvloop"])
def test_auto_and_uvloop_run_on_uvloop_where_it_is_installed(choice: str) -> None:
    uvloop = pytest.importorskip("uvloop")
    factory = serve.event_loop_factory(choice)
    assert factory is uvloop.new_event_loop
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_without_uvloop_auto_falls_back_and_uvloop_by_name_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert serve.event_loop_factory("auto") is None
    with pytest.raises(ConfigError, match=r"process\.event_loop is uvloop, but uvloop is not"):
        serve.event_loop_factory("uvloop")


def test_uvloop_asked_for_and_missing_exits_2_with_one_line(
    calls: Calls, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    monkeypatch.setenv("ORDERED_SIDECAR__PROCESS__EVENT_LOOP", "uvloop")
    assert serve.run_serve(parse(["serve"])) == 2
    assert calls.served == []
    assert capsys.readouterr().err.startswith("sidecar: process.event_loop is uvloop")


def test_serve_runs_on_the_loop_the_setting_names(
    calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    uvloop = pytest.importorskip("uvloop")
    loops: list[object] = []

    async def fake_serve(settings: Settings) -> None:
        loops.append(asyncio.get_running_loop())

    monkeypatch.setattr(serve, "serve", fake_serve)
    for choice, expected in (("uvloop", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)):
        monkeypatch.setenv("ORDERED_SIDECAR__PROCESS__EVENT_LOOP", choice)
        assert serve.run_serve(parse(["serve"])) == 0
        assert isinstance(loops[-1], expected)
    assert not isinstance(loops[-1], uvloop.Loop)


def test_the_process_setting_sets_the_youngest_generation_only() -> None:
    before = gc.get_threshold()
    try:
        tune_process(ProcessSettings(gc_young_threshold=12_345))
        assert gc.get_threshold() == (12_345, before[1], before[2])
    finally:
        gc.set_threshold(*before)
