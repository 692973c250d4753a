"""A partition's buffer and delivered position across rebalances, seeks and refetches.

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

from sidecar.config import ConsumerSettings
from sidecar.core.consume import TopicPartition
from sidecar.service.instance import ConsumerInstance, InstanceConfig
from sidecar.service.partitions import PartitionBuffers, PartitionState
from sidecar.service.release import PollResult

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

    def assign(self, position: int | None) -> None:
        self.assigned = {TP}
        self.positions = {TP: _Position(position)}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def fetch_position(self, tp: TopicPartition) -> int | None:
        if tp not in self.assigned:
            return None
        return self.positions[tp].position if self.positions[tp].has_valid_position else None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp].position = offset

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        pass

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        pass

    async def getmany(self, timeout_ms: int) -> dict[TopicPartition, list[Any]]:
        await self.fetch_returns.wait()
        fetched, self.next_fetch = self.next_fetch, {}
        for tp, records in fetched.items():
            self.positions[tp].position = records[-1].offset + 2  # a commit marker after
        return fetched


def _instance(consumer: _Consumer) -> tuple[ConsumerInstance, Any]:
    """A real instance over the fake consumer; returns it and the fake as the adapter."""
    config = InstanceConfig(group="g", name="i", format="binary")
    context: Any = SimpleNamespace(
        settings=ConsumerSettings(), store=SimpleNamespace(), metrics=SimpleNamespace()
    )
    instance = ConsumerInstance(config, context, instance_key="s-i")
    fake: Any = consumer
    instance._consumer = fake
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
    assert state.fetched_to == 891

    # Released, then the partition is found gone: the records go back for its next owner.
    released = [state.buffer.popleft() for _ in range(len(state.buffer))]
    consumer.assigned = set()
    kept = instance.release._still_assigned(PollResult(released, []), {TP})
    assert kept.records == []
    assert state.delivered == 871

    # Assigned here again; the first fetch runs before the position is reset.
    consumer.assign(None)
    await instance.fetcher.fetch(fake, 0.01)
    assert instance.partitions[TP].delivered == 871

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
    await instance.partitions_assigned({TP})
    consumer.assign(2287)
    await instance.fetcher.fetch(fake, 0.01)
    state = instance.partitions[TP]
    assert list(state.buffer) == []
    assert state.delivered == 2287

    consumer.next_fetch = {TP: _records(2287, 2393)}
    await instance.fetcher.fetch(fake, 0.01)
    assert [r.offset for r in instance.partitions[TP].buffer] == list(range(2287, 2394))


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
    await instance.partitions_assigned({TP})
    consumer.assign(10)
    consumer.next_fetch = {TP: _records(10, 19)}
    consumer.fetch_returns.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    await instance.fetcher.fetch(fake, 0.01)
    assert [r.offset for r in instance.partitions[TP].buffer] == list(range(10, 20))


async def test_dropping_an_old_partition_does_not_drop_a_new_ones_fetch() -> None:
    """During a rebalance the consumer still reports the old assignment, and a poll
    re-creates the old partitions' states. Once the new assignment is in, aiokafka may
    fetch a newly assigned partition before its listener runs; a poll left that fetch
    running. The next poll dropped the old states first, which counted as a fresh start
    of every partition, so the new partition's state looked newer than the fetch and its
    records (the first after the committed offset) were dropped while the consumer's
    position had moved past them. Chaos run 6 lost two records this way."""
    old = TopicPartition("t", 5)
    consumer = _Consumer()
    instance, fake = _instance(consumer)
    consumer.assigned = {old}
    consumer.positions = {old: _Position(40), TP: _Position(None)}
    await instance.fetcher.fetch(fake, 0.01)

    instance.revoked({old})  # the rebalance begins; the old assignment is still reported
    consumer.fetch_returns.clear()
    await instance.fetcher.fetch(fake, 0.01)  # leaves a fetch running, re-creates old's state
    assert old in instance.partitions

    # The new assignment: the fetch reads the new partition before the listener has run.
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


def test_a_refetch_keeps_only_records_past_what_was_buffered_or_delivered() -> None:
    state = PartitionState(delivered=3)
    state.take(_records(0, 5))
    assert [r.offset for r in state.buffer] == [3, 4, 5]
    state.take(_records(4, 7))
    assert [r.offset for r in state.buffer] == [3, 4, 5, 6, 7]


def test_skipped_offsets_below_the_head_or_the_fetch_position_count_as_delivered() -> None:
    state = PartitionState(delivered=2)
    state.take(_records(5, 6))  # 2-4: markers and aborted records
    state.skip_invisible()
    assert state.delivered == 5
    state.buffer.clear()
    state.fetched_to = 9
    state.skip_invisible()
    assert state.delivered == 9
    state.fetched_to = 4  # never backwards
    state.skip_invisible()
    assert state.delivered == 9


def test_buffers_follow_the_assignment_and_report_full_partitions() -> None:
    buffers = PartitionBuffers()
    other = TopicPartition("t", 5)
    buffers.take(
        {TP: _records(0, 2), other: _records(0, 0)}, fetched_in=buffers.epoch, assigned={TP, other}
    )
    assert buffers.full([TP, other], 3) == [TP]
    assert buffers.keep_only({TP}) == [other]
    assert list(buffers) == [TP]
