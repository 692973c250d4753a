"""A partition's delivered position across a rebalance that drops released records.

Seen in a chaos run: an instance released records of a partition, found it no longer
assigned (lost in a rebalance without a revocation) and put them back for the new
owner; the partition came back to the same instance, whose next fetch ran before the
position was reset. The stale fetch position counted the dropped records as skipped
and the refetch discarded them as seen: ten acknowledged records never reached the
group, and later records of their keys did. The group consumer is a fake of the
adapter; the instance and its components are real.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from aiokafka.structs import ConsumerRecord

from sidecar.config import ConsumerSettings
from sidecar.core.consume import TopicPartition
from sidecar.service.instance import ConsumerInstance, InstanceConfig
from sidecar.service.partitions import PartitionBuffers, PartitionState
from sidecar.service.partitions import delivered as _delivered
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

    def assign(self, position: int | None) -> None:
        self.assigned = {TP}
        self.positions = {TP: _Position(position)}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def fetch_position(self, tp: TopicPartition) -> int | None:
        if tp not in self.assigned:
            return None
        return self.positions[tp].position if self.positions[tp].has_valid_position else None

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        pass

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        pass

    async def getmany(self, timeout_ms: int) -> dict[TopicPartition, list[Any]]:
        fetched, self.next_fetch = self.next_fetch, {}
        for tp, records in fetched.items():
            self.positions[tp].position = records[-1].offset + 2  # a commit marker after
        return fetched


def _records(first: int, last: int) -> list[ConsumerRecord[bytes, bytes]]:
    return [
        ConsumerRecord("t", 4, offset, 0, 0, b"k", b"v", None, 1, 1, [])
        for offset in range(first, last + 1)
    ]


async def test_records_dropped_for_a_lost_partition_are_fetched_again_when_it_returns() -> None:
    consumer = _Consumer()
    config = InstanceConfig(group="g", name="i", format="binary")
    context: Any = SimpleNamespace(
        settings=ConsumerSettings(), store=SimpleNamespace(), metrics=SimpleNamespace()
    )
    instance = ConsumerInstance(config, context, instance_key="s-i")
    fake: Any = consumer
    instance._consumer = fake

    consumer.assign(871)
    consumer.next_fetch = {TP: _records(871, 889)}
    await instance.fetcher.fetch(fake, 0.01)
    state = instance.partitions[TP]
    assert [r.offset for r in state.buffer] == list(range(871, 890))
    assert state.fetched_to == 891

    # Released, then the partition is found gone: the records go back for its next owner.
    released = [_delivered(state.buffer.popleft()) for _ in range(len(state.buffer))]
    consumer.assigned = set()
    kept = instance.release._still_assigned(PollResult(released, []))
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
    buffers.take({TP: _records(0, 2), other: _records(0, 0)})
    assert buffers.full([TP, other], 3) == [TP]
    assert buffers.keep_only({TP}) == [other]
    assert list(buffers) == [TP]
