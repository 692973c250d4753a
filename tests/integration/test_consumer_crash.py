"""The guarantee when a consumer is killed while its keys are being revoked.

What every such test checks, and how: ``tests/support/failure_load.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.consumers import serve_callbacks
from ordered_dev.harness.ledger import (
    check_order,
    describe_gates,
)
from ordered_dev.harness.sidecars import (
    check_no_record_crossed_a_barrier,
    unique,
)
from tests.support.failure_load import (
    Load,
    first_delivery,
    kill,
    nobody_held,
    sidecar_processes,
)


@dataclass
class _Victim:
    """The first instance to be told its keys are revoked; it never acknowledges."""

    name: str | None = None
    chosen: asyncio.Event = field(default_factory=asyncio.Event)

    def claims(self, name: str) -> bool:
        """True if ``name`` is (now) the victim."""
        if self.name is None:
            self.name = name
            self.chosen.set()
        return self.name == name

    def on_events(self, name: str, events: list[dict[str, Any]]) -> bool:
        revoked = any(event["type"] == "keys_revoked" for event in events)
        return not ((revoked and self.claims(name)) or self.name == name)


@dataclass
class _SlowApp:
    """A callback app that, for the victim's keys_revoked, is still flushing when its
    sidecar dies (it answers only when the test ends)."""

    name: str
    victim: _Victim
    release: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner, self.url = await serve_callbacks(self._handle)

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["type"] == "keys_revoked" and self.victim.claims(self.name):
            await self.release.wait()
        return web.Response(status=204)


@pytest.mark.parametrize("mode", ["events", "callback"])
async def test_a_consumer_killed_while_its_keys_are_revoked(
    cluster: ClusterEndpoints, mode: str
) -> None:
    """After an expansion, the first instance told that keys of one of its partitions
    moved away (a keys_revoked event it never acknowledges, or a callback still running)
    has its sidecar SIGKILLed; the group moves its partitions once its Kafka session
    times out (10 s) and delivers everything, in order, duplicates only after the kill."""
    topic, group = unique(f"revoke-kill-{mode}"), unique("group")
    load = Load()
    victim = _Victim()
    apps = {name: _SlowApp(name, victim) for name in ("a", "b")}
    async with contextlib.AsyncExitStack() as stack:
        for app in apps.values():
            await app.start()
            stack.push_async_callback(app.stop)
        sidecars = await stack.enter_async_context(sidecar_processes(cluster, {}, {}, {}))
        producer, *consumer_sidecars = sidecars
        by_name = dict(zip(("a", "b"), consumer_sidecars, strict=True))
        await producer.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        try:
            for name, sidecar in by_name.items():
                if mode == "events":
                    load.consume(sidecar, group, name, topic, on_events=victim.on_events)
                else:
                    config = {"callback_url": apps[name].url}
                    load.consume(sidecar, group, name, topic, config=config)
            load.produce(producer, 0, topic)
            load.produce(producer, 1, topic)
            await first_delivery(load.ledger)
            operation = await producer.change_count(topic, 4)
            assert operation["phase"] == "done", operation
            await asyncio.wait_for(victim.chosen.wait(), 20)
            assert victim.name is not None
            load.ledger.disrupted()
            await kill(by_name[victim.name])
            killed = time.monotonic()
            # The group moves the victim's partitions after its Kafka session times out.
            await asyncio.sleep(1.0)
            await load.stop_producers()
            await nobody_held(sidecars, topic, load.ledger)
            await load.drain(30, lambda: describe_gates(sidecars))
            recovered = time.monotonic() - killed
            description = await producer.describe(topic)
        finally:
            await load.cancel()
    duplicates = check_order(load.ledger)
    await check_no_record_crossed_a_barrier(cluster, description)
    print(
        f"{mode}: {victim.name} killed while revoking; the group delivered everything "
        f"{recovered:.1f} s later; {duplicates} duplicates; poll errors "
        f"{load.ledger.poll_errors[:3]}"
    )
