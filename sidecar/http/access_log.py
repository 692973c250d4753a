"""Which requests the access log records.

aiohttp's default logs one line per request at INFO: at a produce rate of thousands of
requests a second that is most of the sidecar's output and a measurable share of its CPU.
By default only failures are logged (status 400 and up), which is what an operator reads
the access log for; ``all`` brings back every line, ``off`` none.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

_logger = logging.getLogger("sidecar.access")


class _AccessLog(AbstractAccessLogger):
    least_status = 0

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        if response.status < self.least_status:
            return
        self.logger.info(
            '%s "%s %s" %d %.1f ms',
            request.remote,
            request.method,
            request.path_qs,
            response.status,
            time * 1000,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


class _ErrorsOnly(_AccessLog):
    least_status = 400


def access_log_options(mode: str) -> dict[str, Any]:
    """Keyword arguments for ``aiohttp.web.AppRunner`` for access log ``mode``."""
    if mode == "off":
        return {"access_log": None}
    cls = _ErrorsOnly if mode == "errors" else _AccessLog
    return {"access_log": _logger, "access_log_class": cls}
