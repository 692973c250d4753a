"""Per-partition buffers and positions of one consumer instance.

Records are fetched into per-partition buffers and released from their heads. Each
partition keeps the positions the release and the commits need (``PartitionState``);
``PartitionBuffers`` keeps them in step with the consumer's assignment and its fetches.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sidecar.core.consume import ConsumedRecord, TopicPartition

_log = logging.getLogger(__name__)


@dataclass
class PartitionState:
    buffer: deque[ConsumedRecord] = field(default_factory=deque)
    delivered: int | None = None
    """Next offset after the last record released or skipped here (relocation tombstones,
    and what a read-committed consumer never returns: transaction markers and aborted
    records); None: nothing yet."""
    released_to: int | None = None
    """Next offset after the last record released to the app."""
    fetched_to: int | None = None
    """The consumer's position when the last fetch was taken into ``buffer``."""
    committed: int | None = None
    """What this instance last committed (or read as the group's committed offset)."""
    since: int = 0
    """``PartitionBuffers.epoch`` when this state began: a fetch that returned before
    then read from a position the consumer has since left (see ``PartitionBuffers``)."""

    def skip_invisible(self) -> None:
        """Count the offsets the consumer skipped as delivered.

        Managed topics are written in transactions: each one ends with a marker that
        takes an offset, and a read-committed consumer never returns markers or aborted
        records. A change's boundary lies past its last marker, so a group that commits
        only "last record + 1" would never reach it. Everything below the buffer's head,
        or with an empty buffer below the fetch position, was released or skipped.
        """
        head = self.buffer[0].offset if self.buffer else self.fetched_to
        if head is not None and (self.delivered is None or head > self.delivered):
            self.delivered = head

    def take(self, records: Sequence[ConsumedRecord]) -> None:
        """Buffer fetched records, less those at or below what was buffered or
        delivered already (a refetch after a seek or a rebalance); batches come in
        offset order."""
        seen = max(
            self.buffer[-1].offset if self.buffer else -1,
            -1 if self.delivered is None else self.delivered - 1,
        )
        if records and records[0].offset > seen:
            self.buffer.extend(records)
            return
        kept = [record for record in records if record.offset > seen]
        # A refetch discards what was released before; a record discarded that was
        # never released here was skipped (a relocation tombstone, or a defect): said,
        # because the second would lose it.
        never_released = [
            r.offset
            for r in records
            if r.offset <= seen and (self.released_to is None or r.offset >= self.released_to)
        ]
        if never_released:
            first = records[0]
            _log.info(
                "%s[%d]: %d fetched records (%d..%d) never released here were discarded as "
                "seen (delivered %s, buffered to %s)",
                first.topic,
                first.partition,
                len(never_released),
                never_released[0],
                never_released[-1],
                self.delivered,
                self.buffer[-1].offset if self.buffer else None,
            )
        self.buffer.extend(kept)

    def put_back(self, record: ConsumedRecord) -> None:
        """A released record the app did not get: at the head again, not delivered."""
        self.buffer.appendleft(record)
        self.delivered = self.released_to = record.offset

    def drop_released(self, offset: int) -> None:
        """Records from ``offset`` on were released but the partition is gone: their
        new owner delivers them, so nothing from here is committed as delivered."""
        self.buffer.clear()
        self.delivered = min(self.delivered or offset, offset)
        # The buffer no longer reaches the old fetch position: were the partition
        # assigned here again, skip_invisible would count the dropped records as
        # skipped, and the refetch would discard them as seen.
        self.fetched_to = None


class PartitionBuffers:
    """The instance's partitions and their states, by partition.

    ``epoch`` counts the times partitions were dropped or started afresh (a rebalance, a
    seek). A fetch left running by one poll may return before such a change and be
    taken by a later poll after it: its records were read from the position the old
    assignment had reached, past what the group committed, while the consumer itself
    starts the new assignment from the committed offset. Taken into the fresh state,
    they would make its head skip everything between, and the refetch of those records
    would be discarded as seen. So a batch is taken only into a state that began no
    later than the fetch returned; the consumer fetches the rest again.
    """

    def __init__(self) -> None:
        self._states: dict[TopicPartition, PartitionState] = {}
        self.epoch = 0

    def __contains__(self, tp: object) -> bool:
        return tp in self._states

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def get(self, tp: TopicPartition) -> PartitionState | None:
        return self._states.get(tp)

    def __getitem__(self, tp: TopicPartition) -> PartitionState:
        return self._states[tp]

    def items(self) -> list[tuple[TopicPartition, PartitionState]]:
        return list(self._states.items())

    def topics(self) -> set[str]:
        return {tp.topic for tp in self._states}

    def ensure(self, tp: TopicPartition) -> PartitionState:
        state = self._states.get(tp)
        if state is None:
            state = self._states[tp] = PartitionState(since=self.epoch)
        return state

    def reset(self, tp: TopicPartition, delivered: int | None = None) -> None:
        """Start ``tp`` afresh (a seek): an empty buffer, delivered up to ``delivered``."""
        self.epoch += 1
        self._states[tp] = PartitionState(delivered=delivered, since=self.epoch)

    def replace_all(self, partitions: Iterable[TopicPartition]) -> None:
        self.epoch += 1
        self._states = {tp: PartitionState(since=self.epoch) for tp in partitions}

    def clear(self) -> None:
        self.epoch += 1
        self._states.clear()

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        self.epoch += 1
        for tp in partitions:
            self._states.pop(tp, None)

    def keep_only(self, assigned: set[TopicPartition]) -> list[TopicPartition]:
        """Drop the partitions no longer assigned; returns them."""
        gone = [tp for tp in self._states if tp not in assigned]
        if gone:
            self.forget(gone)
        return gone

    def full(self, assigned: Iterable[TopicPartition], limit: int) -> list[TopicPartition]:
        """The assigned partitions whose buffers hold ``limit`` records or more (created
        empty for those not seen yet)."""
        return [tp for tp in assigned if len(self.ensure(tp).buffer) >= limit]

    def take(
        self, batches: Mapping[TopicPartition, Sequence[ConsumedRecord]], *, fetched_in: int
    ) -> None:
        """Buffer what a fetch returned while ``epoch`` was ``fetched_in``; batches for
        partitions started afresh since are dropped (the consumer reads them again from
        the position it was given then)."""
        for tp, records in batches.items():
            state = self._states.get(tp)
            if state is None and fetched_in == self.epoch:
                state = self.ensure(tp)
            if state is None or state.since > fetched_in:
                if state is not None and records:
                    _log.info(
                        "%s[%d]: fetch of %d..%d returned before the partition started "
                        "afresh (epoch %d, now %d): read again from the new position",
                        tp.topic,
                        tp.partition,
                        records[0].offset,
                        records[-1].offset,
                        fetched_in,
                        state.since,
                    )
                continue
            state.take(records)

    def note_positions(
        self, assigned: Iterable[TopicPartition], position: Callable[[TopicPartition], int | None]
    ) -> None:
        """Record the fetch positions read right after a fetch was taken; they moved
        with the records just taken (and past the markers and aborted records among and
        after them)."""
        for tp in assigned:
            state = self._states.get(tp)
            if state is None:
                continue  # revoked by a rebalance while the fetch ran
            # None while a reassigned partition's position is being reset: a position
            # from before the rebalance would count records never delivered as skipped.
            state.fetched_to = position(tp)
            state.skip_invisible()

    def undeliver(self, records: Sequence[ConsumedRecord]) -> None:
        """Put back what was released but could not be sent to the app."""
        for record in reversed(records):
            state = self._states.get(TopicPartition(record.topic, record.partition))
            if state is not None:
                state.put_back(record)

    def keep_assigned(
        self, records: Sequence[ConsumedRecord], assigned: set[TopicPartition]
    ) -> list[ConsumedRecord]:
        """Drop what was released from partitions that are no longer assigned (lost in a
        rebalance without a revocation): their new owner delivers them. The position goes
        back, so nothing dropped here is ever committed as delivered."""
        kept = []
        dropped: set[TopicPartition] = set()
        for record in records:
            tp = TopicPartition(record.topic, record.partition)
            if tp in assigned:
                kept.append(record)
                continue
            state = self._states.get(tp)
            if state is not None:
                if tp not in dropped:
                    dropped.add(tp)
                    _log.info(
                        "%s[%d]: released records from %d on dropped, the partition was "
                        "lost to a rebalance",
                        tp.topic,
                        tp.partition,
                        record.offset,
                    )
                state.drop_released(record.offset)
        return kept
