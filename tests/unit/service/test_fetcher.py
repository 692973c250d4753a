"""The fetcher and the instance's positions across rebalances, seeks and refetches.

First seen in a chaos run: an instance released records of a partition, found it no longer
assigned (lost in a rebalance without a revocation) and put them back for the new
owner; the partition came back to the same instance, whose next fetch ran before the
position was reset. The stale fetch position counted the dropped records as skipped
and the refetch discarded them as seen: ten acknowledged records never reached the
group, and later records of their keys did. The group consumer is a fake of the
adapter; the instance and its components are real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from aiokafka.structs import ConsumerRecord

from sidecar.adapters.group_consumer import Fetched
from sidecar.config import ConsumerSettings
from sidecar.core.consume import TopicPartition
from sidecar.service.instance import ConsumerInstance, InstanceConfig
from sidecar.service.release import PollResult
from tests.unit.service import fakes

TP = TopicPartition("t", 4)


class _Position:
    def __init__(self, position: int | None) -> None:
        self.position = position

    @property
    def has_valid_position(self) -> bool:
        return self.position is not None


class _Consumer:
    """What the instance reads of its group consumer: the assignment, positions, fetches."""

    def __init__(self) -> None:
        self.assigned: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, _Position] = {}
        self.next_fetch: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
        self.fetch_returns = asyncio.Event()
        """Cleared: a fetch waits (as aiokafka's does, for records or a rebalance)."""
        self.fetch_returns.set()
        self.current = 1
        """The number of the current assignment (aiokafka's assignment object)."""

    def assign(self, position: int | None) -> None:
        """A rebalance's new assignment of ``TP``: positions start afresh."""
        self.current += 1
        self.assigned = {TP}
        self.positions = {TP: _Position(position)}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def incarnation(self) -> int:
        return self.current

    def fetch_position(self, tp: TopicPartition) -> int | None:
        if tp not in self.assigned:
            return None
        return self.positions[tp].position if self.positions[tp].has_valid_position else None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp].position = offset

    async def committed_epochs(self, partitions: Iterable[TopicPartition]) -> dict[Any, Any]:
        return {}  # the group committed nothing

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        pass

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        pass

    async def fetch(self, timeout_ms: int) -> Fetched:
        await self.fetch_returns.wait()
        fetched, self.next_fetch = self.next_fetch, {}
        for tp, records in fetched.items():
            self.positions[tp].position = records[-1].offset + 2  # a commit marker after
        positions = {tp: p for tp in self.assigned if (p := self.fetch_position(tp)) is not None}
        return Fetched(self.current, dict(fetched), positions, {})


def _instance(consumer: _Consumer) -> tuple[ConsumerInstance, Any]:
    """A real instance over the fake consumer; returns it and the fake as the adapter."""
    config = InstanceConfig(group="g", name="i", format="binary")

    async def unmanaged(topic: str) -> None:
        return None

    context: Any = SimpleNamespace(
        settings=ConsumerSettings(),
        store=SimpleNamespace(),
        metrics=fakes.Metrics(),
        registry=SimpleNamespace(runtime=unmanaged),
    )
    instance = ConsumerInstance(config, context, instance_key="s-i")
    fake: Any = consumer
    instance.state.consumer = fake
    return instance, fake


def _records(first: int, last: int) -> list[ConsumerRecord[bytes, bytes]]:
    return [
        ConsumerRecord("t", 4, offset, 0, 0, b"k", b"v", None, 1, 1, [])
        for offset in range(first, last + 1)
    ]


async def test_records_dropped_for_a_lost_partition_are_fetched_again_when_it_returns() -> None:
    consumer = _Consumer()
    instance, fake = _instance(consumer)

    consumer.assign(871)
    consumer.next_fetch = {TP: _records(871, 889)}
    await instance.fetcher.fetch(fake, 0.01)
    state = instance.partitions[TP]
    assert [r.offset for r in state.buffer] == list(range(871, 890))
    assert state.fetched == 891

    # Released, then the partition is found gone: the records go back, never delivered.
    released = [instance.partitions.release(TP) for _ in range(len(state.buffer))]
    consumer.assigned = set()
    kept = instance.release._still_assigned(PollResult(released, []), {TP})
    assert kept.records == []
    instance.partitions.sent()
    assert state.delivered == 871

    # Assigned here again; the first fetch runs before the position is reset.
    consumer.assign(None)
    await instance.fetcher.fetch(fake, 0.01)
    assert instance.partitions[TP].delivered is None

    # Reset to the group's committed offset: the same records come back and are kept.
    consumer.positions[TP].position = 871
    consumer.next_fetch = {TP: _records(871, 889)}
    await instance.fetcher.fetch(fake, 0.01)
    assert [r.offset for r in instance.partitions[TP].buffer] == list(range(871, 890))


async def test_a_fetch_that_returned_before_a_rebalance_is_not_taken_after_it() -> None:
    """Seen in a chaos run: an instance held a gated run of records (the first of a new
    generation) when a poll left a fetch running; the fetch returned the records after
    that run, then a rebalance gave the partition back to the same instance. The next
    poll took the old fetch into the fresh state, whose head became the first record
    after the run; the consumer's refetch from the group's committed offset was then
    discarded as seen, and the whole run (94 acknowledged records) was never delivered.
    """
    consumer = _Consumer()
    instance, fake = _instance(consumer)

    consumer.assign(2287)
    consumer.next_fetch = {TP: _records(2287, 2379)}
    await instance.fetcher.fetch(fake, 0.01)
    assert instance.partitions[TP].buffer[0].offset == 2287  # the gated run

    # A poll leaves a fetch running; it returns the records after the run.
    consumer.fetch_returns.clear()
    consumer.next_fetch = {TP: _records(2381, 2393)}
    await instance.fetcher.fetch(fake, 0.01)
    consumer.fetch_returns.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)

    # A rebalance gives the partition back; the consumer restarts from the committed offset.
    instance.revoked({TP})
    consumer.assign(2287)
    await instance.partitions_assigned({TP})
    await instance.fetcher.fetch(fake, 0.01)  # takes (drops) the old fetch
    await instance.fetcher.fetch(fake, 0.01)  # a fetch of the new assignment: nothing yet
    state = instance.partitions[TP]
    assert list(state.buffer) == []
    assert state.delivered == 2287

    consumer.next_fetch = {TP: _records(2287, 2393)}
    await instance.fetcher.fetch(fake, 0.01)
    assert [r.offset for r in instance.partitions[TP].buffer] == list(range(2287, 2394))


async def test_a_position_read_between_revocation_and_assignment_is_not_taken() -> None:
    """Chaos run, 59 records lost: a fetch of 11768..11817 returned; the group rebalanced
    (a partition-count change, during a broker restart) and the listener forgot the
    partition; a poll then made its state afresh while aiokafka still reported the old
    assignment, dropped the old fetch, and took that assignment's position (11820) as
    the new state's. The new assignment kept the state, and its refetch from the
    committed offset was discarded as seen."""
    consumer = _Consumer()
    instance, fake = _instance(consumer)
    consumer.assign(11768)
    await instance.fetcher.fetch(fake, 0.01)

    consumer.fetch_returns.clear()
    consumer.next_fetch = {TP: _records(11768, 11817)}
    await instance.fetcher.fetch(fake, 0.01)  # left running
    consumer.fetch_returns.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)

    instance.revoked({TP})  # the old assignment is still the consumer's
    await instance.fetcher.fetch(fake, 0.01)
    assert TP not in instance.partitions  # neither the fetch nor its position taken

    consumer.assign(11768)  # the committed offset
    await instance.partitions_assigned({TP})
    consumer.next_fetch = {TP: _records(11768, 11817)}
    await instance.fetcher.fetch(fake, 0.01)
    assert [r.offset for r in instance.partitions[TP].buffer] == list(range(11768, 11818))


async def test_a_fetch_that_returned_before_a_seek_is_not_taken_after_it() -> None:
    consumer = _Consumer()
    instance, fake = _instance(consumer)
    consumer.assign(60)

    consumer.fetch_returns.clear()
    consumer.next_fetch = {TP: _records(60, 69)}
    await instance.fetcher.fetch(fake, 0.01)
    consumer.fetch_returns.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)

    await instance.seek({TP: 50})  # the app replays from 50
    await instance.fetcher.fetch(fake, 0.01)
    state = instance.partitions[TP]
    assert list(state.buffer) == []
    assert state.delivered == 50


async def test_a_fetch_that_returns_after_a_rebalance_is_taken() -> None:
    """The other order: the fetch waited for the rebalance (aiokafka's does) and read
    from the new position; its records belong to the fresh state."""
    consumer = _Consumer()
    instance, fake = _instance(consumer)
    consumer.assign(10)

    consumer.fetch_returns.clear()
    await instance.fetcher.fetch(fake, 0.01)
    instance.revoked({TP})
    consumer.assign(10)
    await instance.partitions_assigned({TP})
    consumer.next_fetch = {TP: _records(10, 19)}
    consumer.fetch_returns.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    await instance.fetcher.fetch(fake, 0.01)
    assert [r.offset for r in instance.partitions[TP].buffer] == list(range(10, 20))


async def test_a_new_partitions_fetch_before_its_listener_runs_is_kept() -> None:
    """Once the new assignment is in, aiokafka may fetch a newly assigned partition
    before its listener runs, while a poll left that fetch running. Chaos run 6 lost two
    records when such a fetch was dropped while the consumer's position had moved past
    its records."""
    old = TopicPartition("t", 5)
    consumer = _Consumer()
    instance, fake = _instance(consumer)
    consumer.assigned = {old}
    consumer.positions = {old: _Position(40), TP: _Position(None)}
    await instance.fetcher.fetch(fake, 0.01)

    instance.revoked({old})  # the rebalance begins; the old assignment is still reported
    consumer.fetch_returns.clear()
    await instance.fetcher.fetch(fake, 0.01)  # leaves a fetch running
    assert old not in instance.partitions

    # The new assignment: the fetch reads the new partition before the listener has run.
    consumer.current += 1
    consumer.assigned = {TP}
    consumer.positions[TP].position = 2532
    consumer.next_fetch = {TP: _records(2532, 2533)}
    consumer.fetch_returns.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)

    await instance.fetcher.fetch(fake, 0.01)
    await instance.partitions_assigned({TP})
    state = instance.partitions[TP]
    assert [r.offset for r in state.buffer] == [2532, 2533]
    assert old not in instance.partitions
