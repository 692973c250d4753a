"""What the failure scenarios share (tests/integration/test_broker_loss.py,
test_zookeeper_outage.py, test_sidecar_crash.py, test_consumer_crash.py): sidecar
processes on one ZooKeeper root, a produce load with its ledger, killing and checking.

Sidecars are separate ``sidecar serve`` processes, as in production. Each test runs
produce load (per-producer keyed sequences, ``ordered_dev.harness.ledger``) and a consumer
group reading through the gate, causes one failure, and then checks:

* the per-key order checker: every (producer, key) delivered in order, nothing
  acknowledged lost, duplicates only after a crash the test caused;
* ``check_no_record_crossed_a_barrier`` over everything in the topic;
* no sidecar stays held: one more produce through each surviving sidecar goes through
  promptly.

The broker and ZooKeeper tests stop servers of the cluster this run started, so they
skip only against an external cluster (``cluster.servers is None``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from ordered_dev.devcluster.provider import ClusterEndpoints, ClusterServers
from ordered_dev.harness.ledger import (
    Ledger,
    consume_into,
    produce_sequences,
    wait_until_delivered,
)
from ordered_dev.harness.sidecars import (
    SidecarClient,
    SidecarProcess,
    settings_for,
    start_process,
    stop_process,
    unique,
)

BROKER_KILL_TIMING: dict[str, Any] = {"session_timeout_s": 17.0, "request_timeout_ms": 14_000}
HELD_OR_UNAVAILABLE = {(503, 50330), (503, 50320)}
"""Held past the hold timeout / metadata unavailable: retriable, nothing written."""


def local_servers(cluster: ClusterEndpoints) -> ClusterServers:
    if cluster.servers is None:
        pytest.skip("stops cluster servers: needs a cluster this run starts (as in CI)")
    return cluster.servers


@asynccontextmanager
async def sidecar_processes(
    cluster: ClusterEndpoints,
    *options: dict[str, Any],
    root: str | None = None,
    request_timeout_ms: int | None = None,
) -> AsyncIterator[list[SidecarProcess]]:
    """Sidecar processes sharing a ZooKeeper root (a fresh one by default), one per
    ``options`` (keyword arguments of ``settings_for``); all stopped (or reaped, if
    killed) at the end."""
    root = root or f"/{unique('failures')}"
    started: list[SidecarProcess] = []
    try:
        for index, extra in enumerate(options):
            extra = {"request_timeout_ms": request_timeout_ms} | extra
            started.append(await start_process(settings_for(cluster, root, f"f{index}", **extra)))
        yield started
    finally:
        await asyncio.gather(*(stop_process(p) for p in started), return_exceptions=True)


async def kill(sidecar: SidecarProcess) -> None:
    sidecar.process.kill()
    await sidecar.process.wait()


async def produce_once(sidecar: SidecarClient, producer: int, topic: str, ledger: Ledger) -> float:
    """One ledger record through ``sidecar``; returns how long it took (it must succeed)."""
    began = time.monotonic()
    key = f"after-{producer}"
    status, body = await sidecar.produce(
        topic, [{"key": key, "value": {"producer": producer, "key": key, "seq": 0}}]
    )
    assert status == 200, f"{sidecar.id}: {status} {body}"
    entry = body["offsets"][0]
    assert entry["error_code"] is None, entry
    ledger.acknowledged.add((producer, key, 0))
    ledger.placed[(producer, key, 0)] = (entry["partition"], entry["offset"])
    return time.monotonic() - began


async def nobody_held(sidecars: list[SidecarProcess], topic: str, ledger: Ledger) -> None:
    """A produce through every sidecar still running goes straight through."""
    for index, sidecar in enumerate(sidecars):
        if sidecar.process.returncode is None:
            took = await produce_once(sidecar, 90 + index, topic, ledger)
            assert took < 5.0, f"{sidecar.id} held a produce {took:.1f} s after the fault"


async def first_delivery(ledger: Ledger, within_s: float = 30.0) -> None:
    """Wait until the group delivers something: it has joined and the gate is open."""
    deadline = time.monotonic() + within_s
    while not ledger.delivered:
        assert time.monotonic() < deadline, f"nothing delivered; poll errors {ledger.poll_errors}"
        await asyncio.sleep(0.1)


@dataclass
class Load:
    """Producer and consumer tasks of one test, stopped in order: producers first, then
    consumers once everything acknowledged has been delivered."""

    ledger: Ledger = field(default_factory=Ledger)
    stop_producing: asyncio.Event = field(default_factory=asyncio.Event)
    stop_consuming: asyncio.Event = field(default_factory=asyncio.Event)
    producers: list[asyncio.Task[None]] = field(default_factory=list)
    consumers: list[asyncio.Task[None]] = field(default_factory=list)

    def produce(self, sidecar: SidecarClient, producer: int, topic: str, **options: Any) -> None:
        self.producers.append(
            asyncio.create_task(
                produce_sequences(
                    sidecar, producer, topic, self.ledger, self.stop_producing, **options
                )
            )
        )

    def consume(
        self, sidecar: SidecarClient, group: str, name: str, topic: str, **options: Any
    ) -> None:
        self.consumers.append(
            asyncio.create_task(
                consume_into(
                    sidecar, group, name, topic, self.ledger, self.stop_consuming, **options
                )
            )
        )

    async def stop_producers(self) -> None:
        self.stop_producing.set()
        await asyncio.gather(*self.producers)

    async def drain(
        self, within_s: float, diagnose: Callable[[], Awaitable[str]] | None = None
    ) -> None:
        """Wait until everything acknowledged was delivered, then stop the consumers."""
        await wait_until_delivered(self.ledger, within_s, diagnose)
        self.stop_consuming.set()
        await asyncio.gather(*self.consumers)

    async def cancel(self) -> None:
        self.stop_producing.set()
        self.stop_consuming.set()
        tasks = self.producers + self.consumers
        await asyncio.gather(*tasks, return_exceptions=True)
