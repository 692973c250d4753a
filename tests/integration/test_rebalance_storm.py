"""A consumer group rebalancing every second or two while a broker is down.

Chaos runs lost acknowledged records twice in this situation: partition-count changes
rebalanced every ordered group every few seconds while a broker restarted, fetches
were in flight at each rebalance, and the consume path took a position of the revoked
assignment as the new one's (``sidecar.core.positions``). Here the same storm, on the
real cluster: keyed load through two sidecars, a group of three instances (one of them
told of its rebalances, to count them), a change every 1-2 s for 25 s, one broker
killed for 12 s in the middle. Every acknowledged record must reach the group, in
order per key, within 60 s of the storm's end.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.ledger import check_order, describe_gates
from ordered_dev.harness.sidecars import SidecarProcess, check_no_record_crossed_a_barrier, unique
from sidecar.core.errors import KafkaUnavailable
from tests.support.failure_load import (
    BROKER_KILL_TIMING,
    Load,
    first_delivery,
    local_servers,
    sidecar_processes,
)

STORM_S = 25.0
STORM_EXTRA_S = 20.0
REBALANCES = 4
"""Rebalances instance b must have been told of: the storm's premise."""
BROKER_DOWN_AT_S, BROKER_DOWN_FOR_S = 5.0, 12.0
DRAIN_S = 60.0


async def _storm(
    sidecar: SidecarProcess, topic: str, stop: asyncio.Event, outcomes: list[tuple[int, Any]]
) -> None:
    """Expand 4 -> 5 -> 6 -> 7 and shrink back to 4, again and again, as fast as changes
    complete and at least a second apart. An expansion to a partition that is not
    read-only alters the assignable partitions (a rebalance), and so does a retirement
    of a drained one; refused or failed changes are counted, not fatal (a broker is
    down for part of it)."""
    cycle = [5, 6, 7, 4]
    count = 4
    while not stop.is_set():
        target = cycle[(cycle.index(count) + 1) % len(cycle)]
        began = time.monotonic()
        status, body = await sidecar.admin(
            "POST", f"/admin/topics/{topic}/partition-count", {"count": target}
        )
        outcomes.append((status, body.get("error_code")))
        if status == 200:
            count = target
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))


async def test_a_group_rebalancing_every_second_during_a_broker_restart_loses_nothing(
    cluster: ClusterEndpoints,
) -> None:
    local = local_servers(cluster)
    topic, group = unique("storm"), unique("storm-group")
    load = Load()
    notices: dict[str, int] = {}

    def count_notices(name: str, events: list[dict[str, Any]]) -> bool:
        assigned = [e for e in events if e.get("type") == "partitions_assigned"]
        notices[name] = notices.get(name, 0) + len(assigned)
        return True

    victim = local.node_ids()[-1]
    restart: asyncio.Task[None] | None = None
    async with sidecar_processes(cluster, BROKER_KILL_TIMING, BROKER_KILL_TIMING) as sidecars:
        await sidecars[0].create_topic(topic, 4, replication_factor=cluster.replication_factor)
        stop_storm = asyncio.Event()
        outcomes: list[tuple[int, Any]] = []
        storm: asyncio.Task[None] | None = None
        try:
            load.consume(sidecars[0], group, "a", topic, on_events=count_notices)
            load.consume(
                sidecars[0],
                group,
                "b",
                topic,
                on_events=count_notices,
                config={"assignment_events": True},
            )
            load.consume(sidecars[1], group, "c", topic, on_events=count_notices)
            # The broker is down for longer than the brokers' session (9 s), so its
            # partitions and transaction coordinators move meanwhile: a transaction
            # caught by that can outlast the request timeout, and its records are
            # answered kafka unavailable (retriable, never acknowledged). What the test
            # holds the sidecar to is losing nothing it acknowledged.
            for index, sidecar in enumerate(sidecars):
                load.produce(
                    sidecar,
                    index,
                    topic,
                    tolerated={(503, 50330), (503, 50320)},
                    tolerated_records={KafkaUnavailable.error_code},
                )
            await first_delivery(load.ledger)
            # Rebalances deliver what was delivered but not yet committed again.
            load.ledger.disrupted()
            storm = asyncio.create_task(_storm(sidecars[1], topic, stop_storm, outcomes))
            await asyncio.sleep(BROKER_DOWN_AT_S)
            await asyncio.to_thread(local.stop_broker, victim, kill=True)
            await asyncio.sleep(BROKER_DOWN_FOR_S)
            restart = asyncio.create_task(asyncio.to_thread(local.start_broker, victim))
            await asyncio.sleep(STORM_S - BROKER_DOWN_AT_S - BROKER_DOWN_FOR_S)
            # A change rebalances the group only when it alters the assignable
            # partitions (a partition made, a retirement), so how many a storm of a
            # given length brings depends on the retirements' timing: it goes on, for
            # a bounded time, until instance b was told of enough of them.
            extra_until = time.monotonic() + STORM_EXTRA_S
            while notices.get("b", 0) < REBALANCES and time.monotonic() < extra_until:  # noqa: ASYNC110 (a count the consumer task updates)
                await asyncio.sleep(0.5)
            stop_storm.set()
            await storm
            await restart
            await load.stop_producers()
            await load.drain(DRAIN_S, lambda: describe_gates(sidecars))
        finally:
            stop_storm.set()
            await load.cancel()
            if storm is not None:
                await asyncio.gather(storm, return_exceptions=True)
            if restart is not None:
                await asyncio.gather(restart, return_exceptions=True)
        description = await sidecars[0].describe(topic)

    done = sum(1 for status, _ in outcomes if status == 200)
    # The storm happened: changes went through, and the group went through them.
    assert done >= 6, f"only {done} changes done: {outcomes}"
    assert notices.get("b", 0) >= REBALANCES, f"instance b was told of {notices} rebalances"
    duplicates = check_order(load.ledger)
    # Retired partitions were truncated (DeleteRecords): what remains is checked.
    checked = await check_no_record_crossed_a_barrier(cluster, description)
    assert checked > 0
    print(
        f"{done} changes done of {len(outcomes)} asked, broker {victim} down "
        f"{BROKER_DOWN_FOR_S:g} s; instance b rebalanced {notices.get('b', 0)} times; "
        f"{len(load.ledger.acknowledged)} records, {duplicates} duplicates, "
        f"{len(load.ledger.refused)} refused; "
        f"changes answered {sorted(set(outcomes))}"
    )
