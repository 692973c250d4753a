"""The leader epoch of every record a group consumer fetches (KIP-320, consumer side).

A v2 record batch carries the leader epoch of the leader that appended it
(``PartitionLeaderEpoch``, bytes 12-15 of the batch header). KIP-320's consumer keeps the
epoch of the last batch it consumed and, after a leader change, asks the new leader
where that epoch ends (OffsetForLeaderEpoch): an end below the consumer's position means
the log was truncated under it. It also commits that epoch with its position, control
batches (transaction markers) included: a position usually lies just past a commit
marker, which a leader change may have put in a newer epoch than the transaction's
records. aiokafka 0.14 reads the batch header but drops the epoch (``ConsumerRecord``
has no field for it), so this module extends its fetcher, process wide, the way
aiokafka builds it:

* ``aiokafka.consumer.fetcher.MemoryRecords`` (what the fetcher wraps each partition's
  fetched bytes in) becomes ``EpochMemoryRecords``: aiokafka's own reader, plus the
  epochs of the same bytes' batches, read once (``batch_epochs``, per batch, not per
  record), and the epoch of the batch the fetcher took last;
* ``aiokafka.consumer.fetcher.PartitionRecords`` becomes ``EpochPartitionRecords``, whose
  records carry ``leader_epoch`` (read with ``leader_epoch_of``);
* ``aiokafka.consumer.fetcher.FetchResult``'s ``_update_position``, which moves the
  consumer's position past the records handed out (and past the markers and aborted
  batches skipped), also leaves on the partition's state that position with the epoch
  of the last batch read to reach it (read with ``last_batch_of``). That method is
  replaced in aiokafka's class, not the class by a subclass: aiokafka tells a result
  from an error by ``type(result) is FetchResult``, so a result made before ``install``
  (by another consumer of the process) would be taken for an error.

Nothing else changes: the same batches are read by the same code in the same order.
``install`` is idempotent; ``tests/unit/adapters/test_record_epochs.py`` checks that
aiokafka still has what this relies on, and reads epochs out of batches aiokafka builds.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Final

from aiokafka.consumer import fetcher as aiokafka_fetcher

NO_EPOCH: Final = -1
"""Kafka's "no leader epoch": a batch of magic 0 or 1, or a record not read here."""

_LENGTH: Final = struct.Struct(">i")
_LOG_OVERHEAD: Final = 12
"""BaseOffset (int64) and Length (int32): the framing of every batch, of every magic."""
_EPOCH_AT: Final = 12
_MAGIC_AT: Final = 16

_MEMORY_RECORDS: Final[Any] = aiokafka_fetcher.MemoryRecords
_PARTITION_RECORDS: Final[type[Any]] = aiokafka_fetcher.PartitionRecords
_UPDATE_POSITION: Final[Any] = aiokafka_fetcher.FetchResult._update_position


def batch_epochs(data: bytes | memoryview) -> list[int]:
    """The leader epoch of each complete batch in ``data``, in order (NO_EPOCH for magic
    0 and 1). Walks the framing as aiokafka's ``MemoryRecords`` does: a batch cut off at
    the end of a fetch is not a batch (the next fetch reads it whole)."""
    epochs: list[int] = []
    position, size = 0, len(data)
    while size - position >= _LOG_OVERHEAD:
        end = position + _LOG_OVERHEAD + _LENGTH.unpack_from(data, position + 8)[0]
        if end > size:
            break
        if end > position + _MAGIC_AT and data[position + _MAGIC_AT] >= 2:
            epochs.append(_LENGTH.unpack_from(data, position + _EPOCH_AT)[0])
        else:
            epochs.append(NO_EPOCH)
        position = end
    return epochs


class EpochMemoryRecords:
    """aiokafka's ``MemoryRecords`` over one partition's fetched bytes, telling the
    leader epoch of the batch ``next_batch`` returned last (``batch_epoch``)."""

    __slots__ = ("_epochs", "_records", "batch_epoch")

    def __init__(self, data: bytes) -> None:
        self._records = _MEMORY_RECORDS(data)
        self._epochs: Iterator[int] = iter(batch_epochs(data))
        self.batch_epoch = NO_EPOCH

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is not None:
            self.batch_epoch = next(self._epochs, NO_EPOCH)
        return batch


class EpochPartitionRecords(_PARTITION_RECORDS):  # type: ignore[misc]
    """aiokafka's ``PartitionRecords`` whose records carry their batch's leader epoch."""

    @property
    def batch_epoch(self) -> int:
        """The leader epoch of the batch read last: a record's, a marker's, or an
        aborted batch's (aiokafka takes every batch from the reader, also those it
        skips)."""
        return int(getattr(self._records, "batch_epoch", NO_EPOCH))

    def _consumer_record(self, tp: Any, record: Any) -> Any:
        consumer_record = super()._consumer_record(tp, record)
        # A dataclass without slots: the attribute rides along with the record.
        consumer_record.leader_epoch = self.batch_epoch
        return consumer_record


def update_position_keeping_epoch(fetch_result: Any) -> None:
    """``FetchResult._update_position`` (one partition's fetched records, as the
    consumer's ``getmany`` hands them out), leaving the epoch of the last batch read
    beside the position it moves the consumer to."""
    _UPDATE_POSITION(fetch_result)
    # The position is past the batch the records' reader took last: its epoch is the one
    # a commit of that position carries. Kept on aiokafka's partition state, so that a
    # later seek or reset, which moves the position only, leaves the two apart.
    records = fetch_result._partition_records
    state = fetch_result._assignment.state_value(fetch_result._topic_partition)
    state.last_batch = (
        int(records.next_fetch_offset),
        int(getattr(records, "batch_epoch", NO_EPOCH)),
    )


def leader_epoch_of(record: Any) -> int:
    """The leader epoch of a record a group consumer fetched (NO_EPOCH if unknown)."""
    return int(getattr(record, "leader_epoch", NO_EPOCH))


def last_batch_of(partition_state: Any) -> tuple[int, int] | None:
    """(the position a fetch last moved the consumer to in a partition, the leader epoch
    of the last batch it read to get there), from aiokafka's state of an assigned
    partition; None if no fetch has moved it. The position may have been moved since
    (a seek, a reset): compare it with the current one."""
    last = getattr(partition_state, "last_batch", None)
    return None if last is None else (int(last[0]), int(last[1]))


def install() -> None:
    """Make every aiokafka consumer of this process read record epochs. Idempotent."""
    aiokafka_fetcher.MemoryRecords = EpochMemoryRecords
    aiokafka_fetcher.PartitionRecords = EpochPartitionRecords
    aiokafka_fetcher.FetchResult._update_position = update_position_keeping_epoch
