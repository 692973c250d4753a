"""The guarantee through infrastructure failures: a broker, ZooKeeper, a sidecar, a consumer.

Sidecars are separate ``sidecar serve`` processes, as in production. Each test runs
produce load (per-producer keyed sequences, ``tests.support.ledger``) and a consumer
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
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiokafka.admin import AIOKafkaAdminClient
from kazoo.client import KazooClient

from ordered_dev.devcluster.provider import ClusterEndpoints, ClusterServers
from sidecar.compose import SidecarServer
from tests.support.consumers import serve_callbacks
from tests.support.ledger import (
    Ledger,
    check_order,
    consume_into,
    describe_gates,
    produce_sequences,
    wait_until_delivered,
)
from tests.support.sidecars import (
    SidecarClient,
    SidecarProcess,
    check_no_record_crossed_a_barrier,
    read_all,
    settings_for,
    start_process,
    stop_process,
    unique,
    wait_for_final_operation,
)

_BROKER_KILL_TIMING: dict[str, Any] = {"session_timeout_s": 17.0, "request_timeout_ms": 14_000}
HELD_OR_UNAVAILABLE = {(503, 50330), (503, 50320)}
"""Held past the hold timeout / metadata unavailable: retriable, nothing written."""


def _local(cluster: ClusterEndpoints) -> ClusterServers:
    if cluster.servers is None:
        pytest.skip("stops cluster servers: needs a cluster this run starts (as in CI)")
    return cluster.servers


@asynccontextmanager
async def _processes(
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


async def _kill(sidecar: SidecarProcess) -> None:
    sidecar.process.kill()
    await sidecar.process.wait()


async def _produce_once(sidecar: SidecarClient, producer: int, topic: str, ledger: Ledger) -> float:
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


async def _nobody_held(sidecars: list[SidecarProcess], topic: str, ledger: Ledger) -> None:
    """A produce through every sidecar still running goes straight through."""
    for index, sidecar in enumerate(sidecars):
        if sidecar.process.returncode is None:
            took = await _produce_once(sidecar, 90 + index, topic, ledger)
            assert took < 5.0, f"{sidecar.id} held a produce {took:.1f} s after the fault"


async def _first_delivery(ledger: Ledger, within_s: float = 30.0) -> None:
    """Wait until the group delivers something: it has joined and the gate is open."""
    deadline = time.monotonic() + within_s
    while not ledger.delivered:
        assert time.monotonic() < deadline, f"nothing delivered; poll errors {ledger.poll_errors}"
        await asyncio.sleep(0.1)


@dataclass
class _Load:
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


# 1. A broker killed during an expansion --------------------------------------------------


async def _leaders(cluster: ClusterEndpoints, topic: str) -> dict[int, int]:
    """Partition -> the broker leading it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return {int(entry["partition"]): int(entry["leader"]) for entry in described["partitions"]}


def _admin_controller(server: SidecarServer) -> int:
    """The broker the sidecar's admin client sends CreatePartitions to. A KRaft broker
    names a random live broker as "controller" in metadata, and aiokafka keeps sending a
    controller request to the node it picked first until the request timeout."""
    admin = server.kafka._require().admin
    return int(admin._client.cluster.controller.nodeId)


@pytest.mark.parametrize("victim_role", ["leader", "controller"])
async def test_a_broker_killed_during_an_expansion(
    cluster: ClusterEndpoints, victim_role: str
) -> None:
    """The broker dies as the expansion starts: either one leading a partition of the
    topic (the sends in flight to it, and so the barrier, wait for a new leader), or the
    one the coordinator's CreatePartitions goes to. Done or cleanly rolled back, either
    way; no produce fails."""
    local = _local(cluster)
    topic, group, root = unique(f"broker-kill-{victim_role}"), unique("group"), unique("/bk")
    load = _Load()
    # Every sidecar gets a request timeout of 14 s (and so a session of 17 s): a send to
    # the dead leader is retried until the controller moves leadership (its broker
    # session timeout is 9 s), not failed. The coordinator runs in this process so that
    # the test can tell which broker its admin client talks to.
    coordinator = SidecarServer(settings_for(cluster, root, "coordinator", **_BROKER_KILL_TIMING))
    await coordinator.start()
    admin = SidecarClient(
        coordinator.url, coordinator.settings.sidecar_id, aiohttp.ClientSession(coordinator.url)
    )
    restart: asyncio.Task[None] | None = None
    try:
        async with _processes(
            cluster, _BROKER_KILL_TIMING, _BROKER_KILL_TIMING, root=root
        ) as sidecars:
            # Created through another sidecar: the coordinator's admin client then has no
            # connection to its controller whose closing would refresh its metadata.
            await sidecars[0].create_topic(topic, 3, replication_factor=cluster.replication_factor)
            try:
                load.consume(sidecars[0], group, "a", topic)
                load.consume(sidecars[1], group, "b", topic)
                for index, sidecar in enumerate(sidecars):
                    load.produce(sidecar, index, topic)
                await _first_delivery(load.ledger)
                controller = _admin_controller(coordinator)
                if victim_role == "controller":
                    victim = controller
                else:
                    leaders = sorted(set((await _leaders(cluster, topic)).values()) - {controller})
                    assert leaders, "every partition is led by the admin's controller"
                    victim = leaders[0]
                load.ledger.disrupted()
                await asyncio.to_thread(local.stop_broker, victim, kill=True)
                began = time.monotonic()
                try:
                    status, body = await admin.admin(
                        "POST", f"/admin/topics/{topic}/partition-count", {"count": 6}
                    )
                finally:
                    took = time.monotonic() - began
                    restart = asyncio.create_task(asyncio.to_thread(local.start_broker, victim))
                description = await admin.describe(topic)
                operation = description["operation"]
                assert operation["phase"] in ("done", "rolled_back"), (
                    f"the change answered {status} {body} after {took:.1f} s and was left "
                    f"unfinished: {operation}"
                )
                # Done, or rolled back cleanly (40930): neither leaves a barrier behind.
                assert status == 200 or (status, body["error_code"]) == (409, 40930), body
                assert description["pending"] is None
                assert description["undeleted_count"] == (6 if status == 200 else 3)
                await asyncio.sleep(0.5)
                await load.stop_producers()
                await _nobody_held(sidecars, topic, load.ledger)
                await load.drain(30, lambda: describe_gates(sidecars))
            finally:
                await load.cancel()
    finally:
        await admin.http.close()
        await coordinator.stop()
        if restart is not None:
            await restart
    duplicates = check_order(load.ledger)
    checked = await check_no_record_crossed_a_barrier(cluster, description)
    assert checked >= len(load.ledger.acknowledged)
    print(
        f"{victim_role}: broker {victim} killed; change {status} after {took:.1f} s; "
        f"{len(load.ledger.acknowledged)} records, {duplicates} duplicates, "
        f"poll errors {load.ledger.poll_errors[:3]}"
    )


# 2. ZooKeeper away for longer than the session timeout -----------------------------------


def _registrations(hosts: str, root: str) -> dict[str, int]:
    """Registered sidecar ids under ``root`` and the session owning each registration."""
    client = KazooClient(hosts=hosts)
    client.start(timeout=10)
    try:
        owners = {}
        for child in client.get_children(f"{root}/sidecars"):
            _, stat = client.get(f"{root}/sidecars/{child}")
            owners[child] = int(stat.ephemeralOwner)
        return owners
    finally:
        client.stop()
        client.close()


async def _wait_ready(sidecars: list[SidecarProcess], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    for sidecar in sidecars:
        while True:
            async with sidecar.http.get("/readyz") as response:
                if response.status == 200:
                    break
            assert time.monotonic() < deadline, f"{sidecar.id} never became ready again"
            await asyncio.sleep(0.1)


async def test_zookeeper_away_longer_than_the_session_timeout(cluster: ClusterEndpoints) -> None:
    """ZooKeeper down for 8 s under produce load, sessions of 4 s: managed produces are
    held and then refused (503, retriable), nothing is written meanwhile, and afterwards
    both sidecars are registered again (a restarted ZooKeeper restores sessions, so a
    sidecar that reconnects early keeps its session, a later one gets a new one and
    re-registers) and an expansion works."""
    local = _local(cluster)
    topic, group = unique("zk-gone"), unique("group")
    load = _Load()
    options = {"session_timeout_s": 4.0, "hold_timeout_s": 3.0}
    root = f"/{unique('zk-gone')}"
    async with _processes(cluster, options, options, root=root) as sidecars:
        await sidecars[0].create_topic(topic, 2, replication_factor=cluster.replication_factor)
        try:
            load.consume(sidecars[1], group, "a", topic)
            for index, sidecar in enumerate(sidecars):
                load.produce(sidecar, index, topic, tolerated=HELD_OR_UNAVAILABLE)
            await _first_delivery(load.ledger)
            sessions_before = await asyncio.to_thread(_registrations, cluster.zookeeper_hosts, root)
            await asyncio.to_thread(local.stop_zookeeper)
            stopped_at = time.time()
            try:
                await asyncio.sleep(8.0)
            finally:
                restarted_at = time.time()
                await asyncio.to_thread(local.start_zookeeper)
            await _wait_ready(sidecars, within_s=30)
            # Both are registered again, as live sidecars the next barrier waits for.
            deadline = time.monotonic() + 10
            while True:
                sessions_after = await asyncio.to_thread(
                    _registrations, cluster.zookeeper_hosts, root
                )
                if set(sessions_after) == {s.id for s in sidecars}:
                    break
                assert time.monotonic() < deadline, f"registered after: {sessions_after}"
                await asyncio.sleep(0.2)
            operation = await sidecars[1].change_count(topic, 3)
            assert operation["phase"] == "done", operation
            await asyncio.sleep(0.5)
            await load.stop_producers()
            await _nobody_held(sidecars, topic, load.ledger)
            await load.drain(30, lambda: describe_gates(sidecars))
            description = await sidecars[0].describe(topic)
        finally:
            await load.cancel()
    assert load.ledger.refused, "no produce was held past its timeout while ZooKeeper was away"
    print(f"sessions before {sessions_before}, after {sessions_after}")
    check_order(load.ledger)
    await check_no_record_crossed_a_barrier(cluster, description)
    # Nothing was written while ZooKeeper was away (the sessions were suspended within
    # a moment of the server going; allow 0.5 s for the sidecars to see it).
    stored = await read_all(cluster, topic, description["physical_count"])
    blind = [
        (partition, record.offset, record.timestamp / 1000 - stopped_at)
        for partition, records in stored.items()
        for record in records
        if stopped_at + 0.5 < record.timestamp / 1000 < restarted_at
    ]
    assert not blind, f"written while ZooKeeper was away (partition, offset, s after): {blind}"


async def test_zookeeper_restarted_while_a_barrier_is_pending(cluster: ClusterEndpoints) -> None:
    """A ZooKeeper blip (about a second, far shorter than any session timeout) while a
    change waits at its barrier: the change is finished or rolled back within its
    barrier timeout all the same, and then nobody holds produces."""
    local = _local(cluster)
    topic, group = unique("zk-blip"), unique("group")
    load = _Load()
    async with _processes(cluster, {}, {}) as sidecars:
        coordinator, frozen = sidecars
        await coordinator.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        change: asyncio.Task[tuple[int, dict[str, Any]]] | None = None
        try:
            load.consume(coordinator, group, "a", topic)
            load.produce(coordinator, 0, topic, tolerated=HELD_OR_UNAVAILABLE)
            await _first_delivery(load.ledger)
            # A sidecar that cannot ack keeps the barrier pending (its session lives on).
            os.kill(frozen.process.pid, signal.SIGSTOP)
            change = asyncio.create_task(
                coordinator.admin("POST", f"/admin/topics/{topic}/partition-count", {"count": 3})
            )
            deadline = time.monotonic() + 10
            while (await coordinator.describe(topic))["pending"] is None:
                assert time.monotonic() < deadline, "the barrier was never published"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(local.stop_zookeeper)
            try:
                await asyncio.sleep(1.0)
            finally:
                await asyncio.to_thread(local.start_zookeeper)
                os.kill(frozen.process.pid, signal.SIGCONT)
            status, body = await asyncio.wait_for(change, 30)
            # The coordinator may answer that ZooKeeper went away (503, retriable); the
            # change must end all the same, by the barrier deadline (20 s) at the latest.
            description = await wait_for_final_operation(coordinator, topic, within_s=25)
            assert description["pending"] is None
            await load.stop_producers()
            await _nobody_held(sidecars, topic, load.ledger)
            await load.drain(30, lambda: describe_gates(sidecars))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen.process.pid, signal.SIGCONT)
            if change is not None:
                change.cancel()
            await load.cancel()
    check_order(load.ledger)
    await check_no_record_crossed_a_barrier(cluster, description)
    print(f"the coordinator answered {status} {body}; the change ended {description['operation']}")


# 3. A sidecar killed while it holds produce requests -------------------------------------


async def _held_requests(sidecar: SidecarProcess, topic: str) -> float:
    async with sidecar.http.get("/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("sidecar_produce_held_requests{") and f'topic="{topic}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_sidecar_killed_while_holding_produces(cluster: ClusterEndpoints) -> None:
    """A sidecar SIGKILLed while a pending barrier holds its produce requests: they end
    with connection errors and their records never reach Kafka; the change is finished
    by a survivor once the dead coordinator's session expired."""
    topic, group = unique("holder-kill"), unique("group")
    marker = f"never-written-{uuid.uuid4().hex}"
    load = _Load()
    # The coordinator dies right after the barrier passed (every sidecar acked, the
    # boundaries not read yet): the barrier stays pending until a survivor resumes the
    # change, once the coordinator's session has expired.
    coordinator_options = {"kill_after_phase": "reading_boundaries", "session_timeout_s": 4.0}
    async with _processes(cluster, coordinator_options, {"session_timeout_s": 4.0}, {}) as sidecars:
        coordinator, holder, survivor = sidecars
        await survivor.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        held: list[asyncio.Task[tuple[int, dict[str, Any]]]] = []
        try:
            load.consume(survivor, group, "a", topic)
            load.produce(survivor, 0, topic)
            load.produce(holder, 1, topic, until_connection_lost=True)
            await _first_delivery(load.ledger)
            with pytest.raises(aiohttp.ClientError):
                await coordinator.change_count(topic, 4)
            assert await asyncio.wait_for(coordinator.process.wait(), 10) == -9
            coordinator_died = time.monotonic()
            held = [
                asyncio.create_task(
                    holder.produce(
                        topic,
                        [
                            {
                                "key": f"held-{i}",
                                "value": {"producer": 99, "key": "held", "seq": i, "m": marker},
                            }
                        ],
                    )
                )
                for i in range(3)
            ]
            deadline = time.monotonic() + 5
            while await _held_requests(holder, topic) < len(held):
                assert time.monotonic() < deadline, "the holder never held the requests"
                await asyncio.sleep(0.05)
            assert not any(task.done() for task in held)
            await _kill(holder)
            for task in held:
                with pytest.raises(aiohttp.ClientError):
                    await task
            description = await wait_for_final_operation(survivor, topic, within_s=30)
            waited = time.monotonic() - coordinator_died
            await load.stop_producers()
            await _nobody_held(sidecars, topic, load.ledger)
            await load.drain(30, lambda: describe_gates(sidecars))
        finally:
            for task in held:
                task.cancel()
            await load.cancel()
    operation = description["operation"]
    assert operation["phase"] == "done", operation
    assert description["undeleted_count"] == 4
    assert description["pending"] is None
    assert waited > 2.0, "the change finished before the coordinator's session could expire"
    check_order(load.ledger)
    await check_no_record_crossed_a_barrier(cluster, description)
    stored = await read_all(cluster, topic, description["physical_count"])
    leaked = [
        (partition, record.offset)
        for partition, records in stored.items()
        for record in records
        if record.value is not None and marker.encode() in record.value
    ]
    assert not leaked, f"records the killed sidecar held were written: {leaked}"


# 4. A consumer killed while its keys are being revoked -----------------------------------


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
    load = _Load()
    victim = _Victim()
    apps = {name: _SlowApp(name, victim) for name in ("a", "b")}
    async with contextlib.AsyncExitStack() as stack:
        for app in apps.values():
            await app.start()
            stack.push_async_callback(app.stop)
        sidecars = await stack.enter_async_context(_processes(cluster, {}, {}, {}))
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
            await _first_delivery(load.ledger)
            operation = await producer.change_count(topic, 4)
            assert operation["phase"] == "done", operation
            await asyncio.wait_for(victim.chosen.wait(), 20)
            assert victim.name is not None
            load.ledger.disrupted()
            await _kill(by_name[victim.name])
            killed = time.monotonic()
            # The group moves the victim's partitions after its Kafka session times out.
            await asyncio.sleep(1.0)
            await load.stop_producers()
            await _nobody_held(sidecars, topic, load.ledger)
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
