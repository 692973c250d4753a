"""A fetch that returned just before a revocation, taken while the rebalance is open.

Chaos run, 59 acknowledged records never delivered: a consumer instance's fetch of
11768..11817 returned and was left for the next poll; the group rebalanced; between the
revocation and the new assignment (aiokafka still reports the old assignment then) a
poll took the fetch and the old assignment's position; the new assignment restarted
from the committed offset, and its refetch of the same records was discarded as seen.

Here the same order of events on the real cluster, made certain instead of waited for:
the instance's fetch is left running until it has returned, a member joins, another
member keeps the rebalance open for seconds (its revocation listener is slow, as an app
flushing state is), and the instance polls inside that window. Every record must still
reach the app, once the new assignment is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import settings_for, unique
from sidecar.adapters.group_consumer import ordered_assignor
from sidecar.compose import SidecarServer
from sidecar.core.consume import TopicPartition
from sidecar.service.instance import ConsumerInstance, InstanceConfig

SLOW_REVOKE_S = 4.0
"""How long the other member's revocation listener takes: the window stays this open."""


class _SlowRevocation(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.slow = False

    async def on_partitions_revoked(self, revoked: Iterable[object]) -> None:
        if self.slow:
            await asyncio.sleep(SLOW_REVOKE_S)

    async def on_partitions_assigned(self, assigned: Iterable[object]) -> None:
        pass


async def _produce(cluster: ClusterEndpoints, topic: str, first: int, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for sequence in range(first, first + count):
            await producer.send(topic, str(sequence).encode(), key=b"k", partition=0)
        await producer.flush()
    finally:
        await producer.stop()


async def _deliver(instance: ConsumerInstance, want: int, within_s: float) -> list[int]:
    """Poll as the app does (each response counted sent) until ``want`` records came."""
    values: list[int] = []
    deadline = time.monotonic() + within_s
    while len(values) < want and time.monotonic() < deadline:
        result = await instance.poll(0.3, None)
        instance.sent(result)
        values += [int(r.value or b"") for r in result.records]
    return values


async def test_a_fetch_taken_between_revocation_and_assignment_loses_nothing(
    cluster: ClusterEndpoints,
) -> None:
    topic, other, group = unique("window"), unique("window-other"), unique("window-group")
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, 1, cluster.replication_factor) for name in (topic, other)]
        )
    finally:
        await admin.close()
    await _produce(cluster, topic, 0, 100)

    server = SidecarServer(settings_for(cluster, unique("/window"), "window"))
    await server.start()
    await server.wait_ready()
    # The other member reads another topic in the same group: every rebalance waits for
    # its listener, and the instance keeps its partition.
    listener = _SlowRevocation()
    member = _member(cluster, group)
    member.subscribe([other], listener=listener)
    await member.start()
    members = [member]
    member_polls = asyncio.create_task(_keep_polling(member))
    try:
        instance = await server.consumers.create(
            InstanceConfig(group=group, name="a", format="binary", auto_offset_reset="earliest")
        )
        await instance.subscribe([topic], None)
        first = await _deliver(instance, 100, 60)
        assert first == list(range(100))
        await instance.commit(None)  # the group's committed offset: 100

        # A fetch of 100..149 left running by a poll that gave up waiting, until it returned.
        await _produce(cluster, topic, 100, 50)
        consumer = instance.state.consumer
        assert consumer is not None
        poll = asyncio.create_task(instance.fetcher.fetch(consumer, 5.0))
        while instance.fetcher._fetching is None:  # noqa: ASYNC110 (a field, no event)
            await asyncio.sleep(0)
        fetching = instance.fetcher._fetching
        poll.cancel()  # the poll gives up; its fetch goes on
        with contextlib.suppress(asyncio.CancelledError):
            await poll
        await asyncio.wait_for(asyncio.shield(fetching), 30)
        assert fetching.result().batches, "the fetch returned no records"

        # The rebalance: a third member joins. The instance's listener revokes at once;
        # the other member's takes seconds, the group waits for it, and aiokafka reports
        # the instance's old assignment until the group has synced. (A member that only
        # asks to rejoin, with nothing changed, gets its assignment back at once.)
        listener.slow = True
        third = _member(cluster, group)
        third.subscribe([other])
        await third.start()
        members.append(third)
        deadline = time.monotonic() + 30
        while TopicPartition(topic, 0) in instance.partitions:
            assert time.monotonic() < deadline, "the instance was never revoked"
            await asyncio.sleep(0.01)
        assert consumer.assignment() == {TopicPartition(topic, 0)}  # the old one, still
        # A poll inside the window takes the returned fetch.
        await instance.fetcher.fetch(consumer, 0.05)
        listener.slow = False

        # The new assignment restarts from the committed offset: 100..149 come again.
        rest = await _deliver(instance, 50, 60)
        assert rest[:50] == list(range(100, 150)), f"delivered after the rebalance: {rest}"
    finally:
        member_polls.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await member_polls
        for started in members:
            await started.stop()
        await server.stop()


def _member(cluster: ClusterEndpoints, group: str) -> AIOKafkaConsumer:
    """A plain member of the group, with the sidecar's assignor (the group's protocol)."""
    return AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap,
        group_id=group,
        partition_assignment_strategy=(ordered_assignor(lambda topic: None),),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )


async def _keep_polling(member: AIOKafkaConsumer) -> None:
    while True:
        await member.getmany(timeout_ms=200)
