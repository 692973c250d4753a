"""Logging for `sidecar serve`: readable lines, or one JSON object per line.

JSON lines are for log collectors (Loki, Elasticsearch, Cloud Logging): each has the
time (UTC, ISO 8601), the level, the logger, the message and, when there is one, the
exception with its traceback, so a multi-line traceback stays one record.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from sidecar.config import LogSettings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, without newlines inside."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(settings: LogSettings) -> None:
    """Send every log record to stderr in the configured format, from the configured
    level up (replacing what was configured before)."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if settings.format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=settings.level.upper(), handlers=[handler], force=True)
