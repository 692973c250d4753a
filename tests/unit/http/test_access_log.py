"""The access log: failures by default, every request or none when asked."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web

from sidecar.http.access_log import access_log_options


async def _requests(mode: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/ok", ok)
    runner = web.AppRunner(app, **access_log_options(mode))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        with caplog.at_level(logging.INFO, logger="sidecar.access"):
            async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
                for path in ("/ok", "/missing", "/ok?x=1"):
                    async with session.get(path) as response:
                        await response.read()
    finally:
        await runner.cleanup()
    return [r.getMessage() for r in caplog.records if r.name == "sidecar.access"]


async def test_by_default_only_failures_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    lines = await _requests("errors", caplog)
    assert len(lines) == 1
    assert '"GET /missing" 404' in lines[0]


async def test_all_logs_every_request(caplog: pytest.LogCaptureFixture) -> None:
    lines = await _requests("all", caplog)
    assert ['"GET /ok" 200' in lines[0], '"GET /ok?x=1" 200' in lines[2]] == [True, True]
    assert len(lines) == 3


async def test_off_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    assert await _requests("off", caplog) == []
