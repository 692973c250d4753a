"""``sidecar.commands.logs``: the JSON log format and the level setting."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from sidecar.commands.logs import JsonFormatter, configure_logging
from sidecar.config import load_settings


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("sidecar.test", logging.WARNING, __file__, 1, message, args, exc_info)


def test_a_record_is_one_json_object_on_one_line() -> None:
    line = JsonFormatter().format(_record("not ready (waiting for %s)", "kafka", exc=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "sidecar.test"
    assert entry["message"] == "not ready (waiting for kafka)"
    assert entry["time"].endswith("+00:00")
    assert "ValueError: boom\nsecond line" in entry["exception"]


def test_the_settings_choose_format_and_level(capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(
        None, {"ORDERED_SIDECAR__LOG__FORMAT": "json", "ORDERED_SIDECAR__LOG__LEVEL": "warning"}
    )
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging(settings.log)
        logging.getLogger("sidecar.x").info("hidden")
        logging.getLogger("sidecar.x").warning("shown %d", 1)
        lines = capsys.readouterr().err.splitlines()
    finally:
        # As the test found it: a handler left on the captured stderr, which is closed
        # after this test, would fail every later test that logs.
        root.handlers[:] = handlers
        root.setLevel(level)
    assert [json.loads(line)["message"] for line in lines] == ["shown 1"]
