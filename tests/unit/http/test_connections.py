"""Connection bounds (``sidecar.http.connections``) on a real aiohttp server over TCP.

Timeouts are made short; each check waits for the server to act with a generous
bound, which is a liveness check, not a measurement.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from sidecar.config import HttpSettings
from sidecar.http.connections import (
    ConnectionGuard,
    GuardedSite,
    connection_middleware,
    install,
)
from sidecar.http.error_map import errors_middleware
from sidecar.metrics import SidecarMetrics

WITHIN_S = 10.0
"""How long a check waits for the server to close or answer (far above the timeouts)."""


async def echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read())


@asynccontextmanager
async def serving(**limits: Any) -> AsyncIterator[tuple[int, ConnectionGuard, SidecarMetrics]]:
    metrics = SidecarMetrics()
    guard = ConnectionGuard(
        max_connections=limits.get("max_connections", 100),
        header_read_timeout_s=limits.get("header_read_timeout_s", 0.3),
        body_read_timeout_s=limits.get("body_read_timeout_s", 0.3),
        refusal_linger_s=HttpSettings().refusal_linger_s,
        metrics=metrics,
    )
    app = web.Application(middlewares=[errors_middleware, connection_middleware])
    app.router.add_post("/echo", echo)
    install(app, guard)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        keepalive_timeout=limits.get("keepalive_timeout_s", 0.3),
        lingering_time=HttpSettings().lingering_time_s,
    )
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, guard)
    await site.start()
    try:
        yield site.port, guard, metrics
    finally:
        await runner.cleanup()


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    return await asyncio.wait_for(reader.read(), WITHIN_S)


async def eventually(condition: Callable[[], bool]) -> None:
    for _ in range(int(WITHIN_S / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def request(body: bytes = b"{}") -> bytes:
    return b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def timeouts(metrics: SidecarMetrics, part: str) -> float:
    return float(metrics.http_timeouts.labels(part)._value.get())


async def test_a_half_sent_request_head_is_closed() -> None:
    async with serving() as (port, _, metrics):
        reader, writer = await connect(port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Le")
        assert await closed_by_server(reader) == b""
        writer.close()
        assert timeouts(metrics, "header") == 1


async def test_a_connection_that_sends_nothing_is_closed() -> None:
    async with serving() as (port, _, metrics):
        reader, writer = await connect(port)
        assert await closed_by_server(reader) == b""
        writer.close()
        assert timeouts(metrics, "header") == 1


async def test_an_idle_keep_alive_connection_is_closed_after_its_answers() -> None:
    async with serving(header_read_timeout_s=60.0) as (port, guard, _):
        reader, writer = await connect(port)
        for body in (b"first", b"second"):
            writer.write(request(body))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WITHIN_S)
            assert head.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(len(body)) == body
        assert guard.open_connections == 1
        assert await closed_by_server(reader) == b""  # the keep-alive timeout, not the head's
        writer.close()


async def test_a_half_sent_body_is_answered_408_and_closed() -> None:
    async with serving() as (port, _, metrics):
        reader, writer = await connect(port)
        writer.write(b'POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"a"')
        answer = await closed_by_server(reader)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408")
        assert json.loads(body)["error_code"] == 40801
        assert timeouts(metrics, "body") == 1


async def test_a_request_on_a_kept_alive_connection_gets_its_own_head_timer() -> None:
    async with serving(header_read_timeout_s=0.3, keepalive_timeout_s=60.0) as (port, _, m):
        reader, writer = await connect(port)
        writer.write(request())
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WITHIN_S)
        await reader.readexactly(2)
        writer.write(b"POST /echo HTTP/1.1\r\n")  # the next request, half sent
        assert await closed_by_server(reader) == b""
        writer.close()
        assert timeouts(m, "header") == 1


async def test_connections_over_the_limit_are_answered_503_and_closed() -> None:
    async with serving(max_connections=2, header_read_timeout_s=60.0) as (port, guard, m):
        first = await connect(port)
        second = await connect(port)
        await eventually(lambda: guard.open_connections == 2)
        reader, writer = await connect(port)
        writer.write(request())
        answer = await closed_by_server(reader)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503")
        assert b"Retry-After: 1" in head
        error = json.loads(body)
        assert (error["error_code"], error["retriable"]) == (50303, True)
        assert m.http_connections_refused._value.get() == 1
        # Closing one makes room: the next connection is served.
        first[1].close()
        await eventually(lambda: guard.open_connections == 1)
        reader, writer = await connect(port)
        writer.write(request(b"ok"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WITHIN_S)
        assert head.startswith(b"HTTP/1.1 200")
        writer.close()
        second[1].close()


def test_the_guard_serves_bounds_and_refuses_on_uvloop() -> None:
    # process.event_loop auto runs the sidecar on uvloop, whose transports implement
    # asyncio.Transport's methods without deriving from it: the guard once asserted the
    # class and refused every connection there.
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test_connections_over_the_limit_are_answered_503_and_closed())
        runner.run(test_a_half_sent_request_head_is_closed())
        runner.run(test_an_idle_keep_alive_connection_is_closed_after_its_answers())
