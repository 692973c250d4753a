"""A REST Proxy v2 consumer client, as an app would write one, for the tests."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ordered_dev.harness.sidecars import SidecarClient

CONSUMER_JSON = "application/vnd.kafka.v2+json"


@dataclass
class RestConsumer:
    sidecar: SidecarClient
    group: str
    name: str
    format: str = "binary"

    @property
    def path(self) -> str:
        return f"/consumers/{self.group}/instances/{self.name}"

    async def call(
        self, method: str, suffix: str, body: object | None = None, **params: str
    ) -> tuple[int, Any]:
        headers = {"Content-Type": CONSUMER_JSON}
        data = None if body is None else json.dumps(body)
        async with self.sidecar.http.request(
            method, self.path + suffix, data=data, headers=headers, params=params
        ) as response:
            text = await response.text()
            return response.status, (json.loads(text) if text else None)

    async def subscribe(self, *topics: str) -> None:
        status, body = await self.call("POST", "/subscription", {"topics": list(topics)})
        assert status == 204, body

    async def assign(self, *pairs: tuple[str, int]) -> None:
        partitions = [{"topic": t, "partition": p} for t, p in pairs]
        status, body = await self.call("POST", "/assignments", {"partitions": partitions})
        assert status == 204, body

    async def poll(
        self, timeout_ms: int = 500
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(records, hand-off events) of one GET records."""
        status, body = await self.call("GET", "/records", timeout=str(timeout_ms))
        assert status == 200, body
        events = [item for item in body if "type" in item]
        records = [item for item in body if "type" not in item]
        return records, events

    async def poll_and_commit(self, timeout_ms: int = 300) -> list[dict[str, Any]]:
        """One poll as an app that handles every hand-off event at once: acknowledges
        them, then commits what it got. The records of the poll."""
        records, events = await self.poll(timeout_ms)
        if events:
            await self.ack(*[e["event_id"] for e in events])
        if records:
            # The moved keys' new partitions open once the group committed past the
            # boundaries of the partitions they came from; a keys_revoked event not yet
            # acknowledged holds the commit back (409, 40940) until the next poll.
            status, answer = await self.commit()
            assert status in (200, 204) or answer["error_code"] == 40940, answer
        return records

    async def commit(self, offsets: list[dict[str, Any]] | None = None) -> tuple[int, Any]:
        body = None if offsets is None else {"offsets": offsets}
        return await self.call("POST", "/offsets", body)

    async def ack(self, *event_ids: int) -> None:
        status, body = await self.call("POST", "/events/ack", {"event_ids": list(event_ids)})
        assert status == 204, body

    async def delete(self) -> None:
        status, body = await self.call("DELETE", "")
        assert status == 204, body


async def post_create_consumer(
    sidecar: SidecarClient, group: str, body: dict[str, Any]
) -> tuple[int, Any]:
    """``POST /consumers/{group}`` with ``body`` as it is: the status and the JSON answer."""
    async with sidecar.http.post(
        f"/consumers/{group}", data=json.dumps(body), headers={"Content-Type": CONSUMER_JSON}
    ) as response:
        return response.status, await response.json(content_type=None)


async def create_consumer(
    sidecar: SidecarClient, group: str, name: str, **config: object
) -> RestConsumer:
    body = {"name": name, "format": "binary", "auto.offset.reset": "earliest"} | config
    status, answer = await post_create_consumer(sidecar, group, body)
    assert status == 200, answer
    assert answer["base_uri"].endswith(f"/consumers/{group}/instances/{name}")
    return RestConsumer(sidecar, group, name, str(body["format"]))


def decoded(record: dict[str, Any]) -> tuple[bytes | None, bytes | None]:
    key = None if record["key"] is None else base64.b64decode(record["key"])
    value = None if record["value"] is None else base64.b64decode(record["value"])
    return key, value


async def serve_callbacks(
    handle: Callable[[web.Request], Awaitable[web.Response]],
) -> tuple[web.AppRunner, str]:
    """A localhost app answering hand-off callbacks with ``handle``; its runner and URL."""
    app = web.Application()
    app.router.add_post("/handoff", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/handoff"


@dataclass
class CallbackApp:
    """A localhost app receiving key hand-off callbacks, recording their order."""

    events: list[tuple[float, float, dict[str, Any]]] = field(default_factory=list)
    """(started, finished, body) of each successful call, in the order they finished."""
    fail_first: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner, self.url = await serve_callbacks(self._handle)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        if self.fail_first > 0:
            self.fail_first -= 1
            return web.Response(status=500)
        started = time.monotonic()
        body = await request.json()
        await asyncio.sleep(0.05)  # the app flushes or loads state
        self.events.append((started, time.monotonic(), body))
        return web.Response(status=204)
