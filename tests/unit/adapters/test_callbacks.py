"""The hand-off callback client (``sidecar.adapters.callbacks``) against a real HTTP
endpoint on 127.0.0.1 playing the app: what it POSTs, that only a 2xx ends the
retries, and how each kind of failure (an answer, a timeout, no listener, a dropped
connection, a ``still_needed`` that cannot tell) is reported."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import pytest
from aiohttp import web

from sidecar.adapters.callbacks import CallbackClient, CallbackMessage
from sidecar.core.consume import TopicPartition
from sidecar.core.errors import MetadataUnavailable
from sidecar.core.handoff import (
    AssignmentCallback,
    AssignmentChange,
    AssignmentNotice,
    HandoffCallback,
    HandoffKind,
    Subject,
)
from sidecar.http.callback_codec import encode_callback

REVOKED = HandoffCallback(HandoffKind.KEYS_REVOKED, "g", "i-1", Subject("orders", 2, 3))


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    content_type: str
    body: bytes
    client_port: int


class App:
    """The app's callback endpoint: answers each call with the next of ``statuses``
    (the last one repeats), after ``delay_s``; ``drop`` closes the connection instead."""

    def __init__(self, *statuses: int, delay_s: float = 0.0, drop: bool = False) -> None:
        self.statuses = list(statuses or (204,))
        self.delay_s = delay_s
        self.drop = drop
        self.received: list[Received] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.received.append(
            Received(
                request.method,
                request.path,
                request.headers.get("Content-Type", ""),
                await request.read(),
                peer[1] if peer else -1,
            )
        )
        if self.drop:
            assert request.transport is not None
            request.transport.close()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return web.Response(status=status)


@asynccontextmanager
async def serving(app: App, sock: socket.socket | None = None) -> AsyncIterator[str]:
    """``app`` listening on 127.0.0.1 (on ``sock`` if given); yields its callback URL."""
    server = web.Application()
    server.router.add_post("/hand-off", app.handle)
    runner = web.AppRunner(server, shutdown_timeout=0.1)
    await runner.setup()
    site: web.BaseSite = (
        web.SockSite(runner, sock) if sock is not None else web.TCPSite(runner, "127.0.0.1", 0)
    )
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}/hand-off"
    finally:
        await runner.cleanup()


@contextmanager
def bound_not_listening() -> Iterator[socket.socket]:
    # A port bound on 127.0.0.1 but not listening refuses connections, and nothing else
    # can take it while the test runs.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield sock
    finally:
        sock.close()


class Attempts:
    """What ``observe`` was told, and how often the body was encoded."""

    def __init__(self) -> None:
        self.observed: list[tuple[CallbackMessage, float, bool]] = []
        self.encoded = 0

    def encode(self, message: CallbackMessage) -> bytes:
        self.encoded += 1
        return encode_callback(message)

    def observe(self, message: CallbackMessage, seconds: float, ok: bool) -> None:
        self.observed.append((message, seconds, ok))

    @property
    def oks(self) -> list[bool]:
        return [ok for _, _, ok in self.observed]


@asynccontextmanager
async def callback_client(
    url: str, attempts: Attempts, *, timeout_s: float = 1.0, retry_s: float = 0.02
) -> AsyncIterator[CallbackClient]:
    client = CallbackClient(
        url, timeout_s=timeout_s, retry_s=retry_s, encode=attempts.encode, observe=attempts.observe
    )
    try:
        yield client
    finally:
        await client.close()


def answers(*values: bool | Exception) -> tuple[Callable[[], Awaitable[bool]], list[int]]:
    """A ``still_needed`` giving ``values`` in turn (the last repeats; an exception is
    raised), and the list its asks are counted in."""
    asked: list[int] = []
    pending = list(values)

    async def still_needed() -> bool:
        asked.append(len(asked))
        value = pending.pop(0) if len(pending) > 1 else pending[0]
        if isinstance(value, Exception):
            raise value
        return value

    return still_needed, asked


# What is sent -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        REVOKED,
        AssignmentCallback(
            "g",
            "i-1",
            AssignmentNotice(AssignmentChange.PARTITIONS_ASSIGNED, (TopicPartition("t", 0),)),
        ),
    ],
    ids=["keys_revoked", "partitions_assigned"],
)
async def test_a_message_is_posted_once_as_json_and_a_2xx_returns_none(
    message: CallbackMessage,
) -> None:
    app, attempts = App(204), Attempts()
    async with serving(app) as url, callback_client(url, attempts) as client:
        assert await client.post(message, within_s=5.0) is None
    assert len(app.received) == 1
    call = app.received[0]
    assert (call.method, call.path, call.content_type) == ("POST", "/hand-off", "application/json")
    assert call.body == encode_callback(message)
    assert json.loads(call.body)["group"] == "g"
    assert [(m, ok) for m, _, ok in attempts.observed] == [(message, True)]


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
async def test_any_2xx_answer_ends_the_call(status: int) -> None:
    app, attempts = App(status), Attempts()
    async with serving(app) as url, callback_client(url, attempts) as client:
        assert await client.post(REVOKED, within_s=5.0) is None
    assert len(app.received) == 1
    assert attempts.oks == [True]


async def test_an_attempt_is_observed_with_how_long_the_app_took() -> None:
    app, attempts = App(204, delay_s=0.2), Attempts()
    async with serving(app) as url, callback_client(url, attempts) as client:
        await client.post(REVOKED, within_s=5.0)
    [(_, seconds, ok)] = attempts.observed
    assert ok
    assert 0.2 <= seconds < 2.0


# Retries ------------------------------------------------------------------------------------


async def test_a_non_2xx_answer_is_retried_with_the_same_body_until_a_2xx() -> None:
    app, attempts = App(503, 500, 404, 204), Attempts()
    async with serving(app) as url, callback_client(url, attempts, retry_s=0.01) as client:
        assert await client.post(REVOKED, within_s=5.0) is None
    assert len(app.received) == 4
    assert {call.body for call in app.received} == {encode_callback(REVOKED)}
    assert attempts.oks == [False, False, False, True]
    # Encoded once per call, not once per attempt.
    assert attempts.encoded == 1


@pytest.mark.parametrize("status", [300, 304, 400, 409, 500, 503])
async def test_an_app_that_never_answers_2xx_gets_its_last_status_reported(status: int) -> None:
    app, attempts = App(status), Attempts()
    began = time.monotonic()
    async with serving(app) as url, callback_client(url, attempts, retry_s=0.05) as client:
        assert await client.post(REVOKED, within_s=0.3) == f"status {status}"
    elapsed = time.monotonic() - began
    assert 0.3 <= elapsed < 3.0
    assert len(app.received) >= 3
    assert attempts.oks == [False] * len(app.received)


async def test_the_reason_is_the_last_attempts_status() -> None:
    app, attempts = App(500, 500, 503), Attempts()
    async with serving(app) as url, callback_client(url, attempts, retry_s=0.05) as client:
        assert await client.post(REVOKED, within_s=0.3) == "status 503"


async def test_within_zero_makes_exactly_one_attempt() -> None:
    app, attempts = App(503, 204), Attempts()
    async with serving(app) as url, callback_client(url, attempts, retry_s=0.01) as client:
        assert await client.post(REVOKED, within_s=0.0) == "status 503"
    assert len(app.received) == 1
    assert attempts.oks == [False]


# Failures without an answer -------------------------------------------------------------------


async def test_an_app_slower_than_the_timeout_is_a_timeout_failure() -> None:
    app, attempts = App(204, delay_s=2.0), Attempts()
    began = time.monotonic()
    async with serving(app) as url, callback_client(url, attempts, timeout_s=0.2) as client:
        reason = await client.post(REVOKED, within_s=0.0)
    assert reason is not None
    assert "TimeoutError" in reason
    assert time.monotonic() - began < 1.5  # the attempt gave up, it did not wait the 2 s
    [(_, seconds, ok)] = attempts.observed
    assert not ok
    assert 0.2 <= seconds < 1.5


async def test_a_refused_connection_is_reported_as_a_connection_error() -> None:
    attempts = Attempts()
    with bound_not_listening() as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/hand-off"
        async with callback_client(url, attempts, retry_s=0.01) as client:
            reason = await client.post(REVOKED, within_s=0.1)
    assert reason is not None
    assert reason.startswith("ClientConnectorError(")
    assert "ConnectionRefusedError" in reason
    assert len(attempts.observed) >= 2
    assert set(attempts.oks) == {False}


async def test_an_app_that_starts_listening_late_is_reached_by_a_retry() -> None:
    app, attempts = App(204), Attempts()
    with bound_not_listening() as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/hand-off"
        async with callback_client(url, attempts, retry_s=0.02) as client:
            call = asyncio.create_task(client.post(REVOKED, within_s=5.0))
            await asyncio.sleep(0.15)
            assert not call.done()
            async with serving(app, sock):
                assert await asyncio.wait_for(call, 5.0) is None
    assert len(app.received) == 1
    assert attempts.oks[-1] is True
    assert attempts.oks.count(False) >= 2


async def test_a_dropped_connection_is_a_failure_and_is_retried() -> None:
    app, attempts = App(204, drop=True), Attempts()
    async with serving(app) as url, callback_client(url, attempts, retry_s=0.01) as client:
        reason = await client.post(REVOKED, within_s=0.1)
    assert reason is not None
    assert reason.startswith(("ServerDisconnectedError(", "ClientOSError("))
    assert len(app.received) >= 2
    assert set(attempts.oks) == {False}


# still_needed ---------------------------------------------------------------------------------


async def test_a_call_no_longer_needed_returns_none_without_posting() -> None:
    app, attempts = App(204), Attempts()
    still_needed, asked = answers(False)
    async with serving(app) as url, callback_client(url, attempts) as client:
        assert await client.post(REVOKED, within_s=5.0, still_needed=still_needed) is None
    assert asked == [0]
    assert app.received == []
    assert attempts.observed == []


async def test_still_needed_is_asked_before_every_attempt() -> None:
    # The app refuses twice; then the call is no longer needed (another instance got it
    # acknowledged): it stops with None, without a third POST.
    app, attempts = App(503), Attempts()
    still_needed, asked = answers(True, True, False)
    async with serving(app) as url, callback_client(url, attempts, retry_s=0.01) as client:
        assert await client.post(REVOKED, within_s=5.0, still_needed=still_needed) is None
    assert len(asked) == 3
    assert len(app.received) == 2
    assert attempts.oks == [False, False]


async def test_a_sidecar_error_from_still_needed_is_a_failed_attempt_that_is_retried() -> None:
    app, attempts = App(204), Attempts()
    still_needed, asked = answers(MetadataUnavailable("zookeeper away"), True)
    async with serving(app) as url, callback_client(url, attempts, retry_s=0.01) as client:
        assert await client.post(REVOKED, within_s=5.0, still_needed=still_needed) is None
    assert len(asked) == 2
    assert len(app.received) == 1
    # Only POSTs are observed: the failed ask called nobody.
    assert attempts.oks == [True]


async def test_a_still_needed_failing_until_the_deadline_reports_its_message() -> None:
    app, attempts = App(204), Attempts()
    still_needed, asked = answers(MetadataUnavailable("zookeeper away"))
    async with serving(app) as url, callback_client(url, attempts, retry_s=0.02) as client:
        reason = await client.post(REVOKED, within_s=0.1, still_needed=still_needed)
    assert reason == "zookeeper away"
    assert len(asked) >= 2
    assert app.received == []
    assert attempts.observed == []


async def test_an_error_other_than_a_sidecar_error_from_still_needed_propagates() -> None:
    app, attempts = App(204), Attempts()
    still_needed, _ = answers(RuntimeError("bug"))
    async with serving(app) as url, callback_client(url, attempts) as client:
        with pytest.raises(RuntimeError, match="bug"):
            await client.post(REVOKED, within_s=5.0, still_needed=still_needed)
    assert app.received == []


# The session ---------------------------------------------------------------------------------


async def test_the_calls_of_one_client_share_one_connection() -> None:
    app, attempts = App(204), Attempts()
    async with serving(app) as url, callback_client(url, attempts) as client:
        for _ in range(3):
            assert await client.post(REVOKED, within_s=5.0) is None
    assert len(app.received) == 3
    assert len({call.client_port for call in app.received}) == 1


async def test_a_closed_client_posts_again_on_a_new_connection() -> None:
    app, attempts = App(204), Attempts()
    async with serving(app) as url, callback_client(url, attempts) as client:
        assert await client.post(REVOKED, within_s=5.0) is None
        await client.close()
        assert await client.post(REVOKED, within_s=5.0) is None
    assert len(app.received) == 2
    assert app.received[0].client_port != app.received[1].client_port


async def test_closing_a_client_that_never_posted_or_twice_is_harmless() -> None:
    client = CallbackClient(
        "http://127.0.0.1:9/hand-off",
        timeout_s=1.0,
        retry_s=0.1,
        encode=encode_callback,
        observe=Attempts().observe,
    )
    await client.close()
    await client.close()
