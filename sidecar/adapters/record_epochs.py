"""The leader epoch of every record a group consumer fetches (KIP-320, consumer side).

A v2 record batch carries the leader epoch of the leader that appended it
(``PartitionLeaderEpoch``, bytes 12-15 of the batch header). KIP-320's consumer keeps the
epoch of the last record it consumed and, after a leader change, asks the new leader
where that epoch ends (OffsetForLeaderEpoch): an end below the consumer's position means
the log was truncated under it. aiokafka 0.14 reads the batch header but drops the epoch
(``ConsumerRecord`` has no field for it), so this module extends its fetcher, process
wide, the way aiokafka builds it:

* ``aiokafka.consumer.fetcher.MemoryRecords`` (what the fetcher wraps each partition's
  fetched bytes in) becomes ``EpochMemoryRecords``: aiokafka's own reader, plus the
  epochs of the same bytes' batches, read once (``batch_epochs``, per batch, not per
  record), and the epoch of the batch the fetcher took last;
* ``aiokafka.consumer.fetcher.PartitionRecords`` becomes ``EpochPartitionRecords``, whose
  records carry ``leader_epoch`` (read with ``leader_epoch_of``).

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

    def _consumer_record(self, tp: Any, record: Any) -> Any:
        consumer_record = super()._consumer_record(tp, record)
        # A dataclass without slots: the attribute rides along with the record.
        consumer_record.leader_epoch = getattr(self._records, "batch_epoch", NO_EPOCH)
        return consumer_record


def leader_epoch_of(record: Any) -> int:
    """The leader epoch of a record a group consumer fetched (NO_EPOCH if unknown)."""
    return int(getattr(record, "leader_epoch", NO_EPOCH))


def install() -> None:
    """Make every aiokafka consumer of this process read record epochs. Idempotent."""
    aiokafka_fetcher.MemoryRecords = EpochMemoryRecords
    aiokafka_fetcher.PartitionRecords = EpochPartitionRecords
