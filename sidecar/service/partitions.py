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

    ``epoch`` counts the times the consumer's positions were set anew: every partition's
    at a rebalance (aiokafka's group consumer revokes every partition and assigns anew),
    a manual assignment or an unsubscribe; one partition's at a seek. A fetch left
    running by one poll may return before such a change and be taken by a later poll
    after it: its records were read from the position the old assignment had reached,
    past what the group committed, while the consumer itself starts the new assignment
    from the committed offset. Taken into the fresh state, they would make its head skip
    everything between, and the refetch of those records would be discarded as seen. So
    a batch is taken only if no change of the partition's position came after the
    fetch returned; the consumer fetches the rest again.

    Dropping the state of a partition that is no longer assigned moves no position, so
    it is no such change: counted as one, it made a fetch of another partition, newly
    assigned and returned before its state was created, look older than that state, and
    the batch was dropped while the consumer's position had moved past it.
    """

    def __init__(self) -> None:
        self._states: dict[TopicPartition, PartitionState] = {}
        self.epoch = 0
        self._all_set_at = 0
        """``epoch`` when every position was last set anew."""
        self._seeks: dict[TopicPartition, int] = {}
        """``epoch`` of each partition's last seek since then."""

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

    def _position_set_at(self, tp: TopicPartition) -> int:
        return max(self._all_set_at, self._seeks.get(tp, 0))

    def _all_positions_set_anew(self) -> None:
        self.epoch += 1
        self._all_set_at = self.epoch
        self._seeks.clear()
        self._states.clear()

    def ensure(self, tp: TopicPartition) -> PartitionState:
        state = self._states.get(tp)
        if state is None:
            state = self._states[tp] = PartitionState()
        return state

    def reset(self, tp: TopicPartition, delivered: int | None = None) -> None:
        """Start ``tp`` afresh (a seek): an empty buffer, delivered up to ``delivered``."""
        self.epoch += 1
        self._seeks[tp] = self.epoch
        self._states[tp] = PartitionState(delivered=delivered)

    def replace_all(self, partitions: Iterable[TopicPartition]) -> None:
        self._all_positions_set_anew()
        self._states = {tp: PartitionState() for tp in partitions}

    def clear(self) -> None:
        self._all_positions_set_anew()

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """A rebalance revoked ``partitions``: every position is set anew, so every state
        goes, also one a poll created during the rebalance for the old assignment."""
        del partitions  # the whole assignment, with aiokafka's eager rebalancing
        self._all_positions_set_anew()

    def keep_only(self, assigned: set[TopicPartition]) -> list[TopicPartition]:
        """Drop the partitions no longer assigned; returns them."""
        gone = [tp for tp in self._states if tp not in assigned]
        for tp in gone:
            del self._states[tp]
            self._seeks.pop(tp, None)
        return gone

    def full(self, assigned: Iterable[TopicPartition], limit: int) -> list[TopicPartition]:
        """The assigned partitions whose buffers hold ``limit`` records or more (created
        empty for those not seen yet)."""
        return [tp for tp in assigned if len(self.ensure(tp).buffer) >= limit]

    def take(
        self,
        batches: Mapping[TopicPartition, Sequence[ConsumedRecord]],
        *,
        fetched_in: int,
        assigned: set[TopicPartition],
    ) -> None:
        """Buffer what a fetch returned while ``epoch`` was ``fetched_in``, for the
        partitions ``assigned`` now; a batch of a partition whose position was set anew
        since is dropped (the consumer reads it again from the position it was given)."""
        for tp, records in batches.items():
            if tp not in assigned:
                continue
            set_at = self._position_set_at(tp)
            if set_at > fetched_in:
                if records:
                    _log.info(
                        "%s[%d]: fetch of %d..%d returned before the partition's position "
                        "was set anew (epoch %d, now %d): read again from the new position",
                        tp.topic,
                        tp.partition,
                        records[0].offset,
                        records[-1].offset,
                        fetched_in,
                        set_at,
                    )
                continue
            self.ensure(tp).take(records)

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
