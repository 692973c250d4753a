"""Bounds on the sidecar's HTTP connections: how many, and how long a request may dribble.

aiohttp alone keeps a connection open as long as its client wants: one that sends half a
request head, or a head and half a body, holds a socket and a task forever, and nothing
bounds how many such connections there are. Four settings (``http`` section) bound them:

=============================  =============================================================
setting                        what happens
=============================  =============================================================
``max_connections``            a connection beyond it is answered 503 (50303, retriable,
                               ``Retry-After``) and closed before its request is read
``header_read_timeout_s``      a request head not complete this long after the connection
                               opened, or after its first byte on a kept-alive connection,
                               closes the connection (no answer: the client has not asked)
``body_read_timeout_s``        a request body not complete this long after its head is
                               answered 408 (40801) and the connection closed
``keepalive_timeout_s``        an idle kept-alive connection is closed (aiohttp's own timer)
=============================  =============================================================

A ``ConnectionGuard`` wraps aiohttp's request handler protocol: it counts connections,
refuses those over the limit and runs the head timer; ``GuardedSite`` listens with it;
``connection_middleware`` tells the guard when a request head has arrived and reads the
body under its timeout. Open, refused and timed-out connections are counted in metrics.

A chunked body sent to a handler marked ``streams_body`` (REST Proxy v3's streaming
produce) has no end to wait for: the middleware leaves it to the handler, which reads
it record by record and bounds how long it waits for the next bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, cast

from aiohttp import web
from aiohttp.typedefs import Handler

from sidecar.core.errors import RequestTimeout, TooManyConnections
from sidecar.http.error_map import error_response
from sidecar.metrics import SidecarMetrics


class ConnectionGuard:
    def __init__(
        self,
        *,
        max_connections: int,
        header_read_timeout_s: float,
        body_read_timeout_s: float,
        refusal_linger_s: float,
        metrics: SidecarMetrics,
    ) -> None:
        self.max_connections = max_connections
        self.refusal_linger_s = refusal_linger_s
        self.header_read_timeout_s = header_read_timeout_s
        self.body_read_timeout_s = body_read_timeout_s
        self._metrics = metrics
        self._open: dict[asyncio.BaseProtocol, _GuardedProtocol] = {}
        """Open connections by aiohttp's protocol (what ``request.protocol`` is)."""

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def protocol_factory(
        self, make_protocol: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        """A factory for ``loop.create_server`` that guards ``make_protocol``'s protocols."""
        return lambda: _GuardedProtocol(self, make_protocol)

    def request_started(self, request: web.BaseRequest) -> None:
        guarded = self._open.get(request.protocol)
        if guarded is not None:
            guarded.request_started()

    def request_finished(self, request: web.BaseRequest) -> None:
        guarded = self._open.get(request.protocol)
        if guarded is not None:
            guarded.request_finished()

    def _admit(self, guarded: _GuardedProtocol, inner: asyncio.Protocol) -> bool:
        if len(self._open) >= self.max_connections:
            self._metrics.http_connections_refused.inc()
            return False
        self._open[inner] = guarded
        self._metrics.http_connections.set(len(self._open))
        return True

    def _closed(self, inner: asyncio.Protocol) -> None:
        if self._open.pop(inner, None) is not None:
            self._metrics.http_connections.set(len(self._open))

    def _head_timed_out(self) -> None:
        self._metrics.http_timeouts.labels("header").inc()

    def _body_timed_out(self) -> None:
        self._metrics.http_timeouts.labels("body").inc()


GUARD_KEY: Final = web.AppKey("connection_guard", ConnectionGuard)


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard's count and head timer.

    Every callback asyncio makes is passed on to aiohttp's protocol unless the
    connection was refused, in which case aiohttp never sees it.
    """

    def __init__(
        self, guard: ConnectionGuard, make_protocol: Callable[[], asyncio.Protocol]
    ) -> None:
        self._guard = guard
        self._make_protocol = make_protocol
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_request = False
        self._refused = False

    # asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always an ``asyncio.Transport`` subclass:
        # uvloop's implement its methods without deriving from it.
        stream = self._transport = cast(asyncio.Transport, transport)
        inner = self._make_protocol()
        if not self._guard._admit(self, inner):
            self._refuse(stream)
            return
        self._inner = inner
        self._start_head_timer()
        inner.connection_made(stream)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return  # refused: whatever the client sends is dropped
        if not self._in_request and self._head_timer is None:
            self._start_head_timer()  # the first byte of a request on a kept-alive connection
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is None:
            if self._transport is not None:
                self._transport.close()
            return None
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        if self._inner is not None:
            self._guard._closed(self._inner)
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    # From the middleware -------------------------------------------------------------------

    def request_started(self) -> None:
        self._in_request = True
        self._stop_head_timer()

    def request_finished(self) -> None:
        self._in_request = False

    # Internals -----------------------------------------------------------------------------

    def _start_head_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self._guard.header_read_timeout_s, self._head_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._in_request or self._transport is None:
            return
        self._guard._head_timed_out()
        self._transport.close()

    def _refuse(self, transport: asyncio.Transport) -> None:
        self._refused = True
        response = error_response(
            TooManyConnections(
                f"the sidecar serves at most {self._guard.max_connections} connections at once"
            )
        )
        body = response.body
        assert isinstance(body, bytes)
        extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers.items())
        head = (
            "HTTP/1.1 503 Service Unavailable\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"{extra}"
            "Connection: close\r\n\r\n"
        )
        transport.write(head.encode("ascii") + body)
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(self._guard.refusal_linger_s, transport.close)


class GuardedSite(web.BaseSite):
    """A TCP site whose connections pass through ``guard``."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one chosen for port 0)."""
        sockets = getattr(self._server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard.protocol_factory(server), self._host, self._port, backlog=self._backlog
        )


@web.middleware
async def connection_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the guard the head has arrived; read the body within its timeout.

    A body not complete in ``body_read_timeout_s`` is answered 408 and the connection is
    closed (what is left of the body cannot be told from a next request).
    """
    guard = request.app.get(GUARD_KEY)
    if guard is None:
        return await handler(request)
    guard.request_started(request)
    try:
        if request.content_length is None and request.match_info.handler in _STREAMED_BODIES:
            # A chunked body of a streaming route is read by its handler as it arrives,
            # each record in turn; it has no end to wait for (the handler bounds idleness).
            return await handler(request)
        try:
            # Read once here, cached by aiohttp: the handlers' own read() returns it.
            async with asyncio.timeout(guard.body_read_timeout_s):
                await request.read()
        except TimeoutError:
            guard._body_timed_out()
            response = error_response(
                RequestTimeout(
                    f"the request body did not arrive within {guard.body_read_timeout_s:g} s"
                )
            )
            response.force_close()
            return response
        return await handler(request)
    finally:
        guard.request_finished(request)


_STREAMED_BODIES: set[Handler] = set()


def streams_body(handler: Handler) -> Handler:
    """Mark ``handler`` as reading a chunked request body itself, as it arrives.

    ``connection_middleware`` then does not wait for the whole body first: the handler
    must bound how long it waits for each part.
    """
    _STREAMED_BODIES.add(handler)
    return handler


def install(app: web.Application, guard: ConnectionGuard) -> None:
    """Make ``connection_middleware`` of ``app`` report to ``guard``."""
    app[GUARD_KEY] = guard
