"""What the consume path speaks of, independent of the Kafka client. Pure.

The group-consumer adapter (``sidecar.adapters.group_consumer``) hands the service
records and partitions of these shapes; the service never sees aiokafka's types.
``TopicPartition`` is a named tuple of the same fields as aiokafka's, so the two
compare and hash alike; the adapter still converts at its edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Offsetted(Protocol):
    """What the positions model (``core.positions``) and the commit epochs
    (``core.commit_epochs``) need of a record: its offset."""

    @property
    def offset(self) -> int: ...


class ConsumedRecord(Protocol):
    """A record as a read-committed consumer returns it (aiokafka's ``ConsumerRecord``
    has this shape and is passed through without copying)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


class LastBatch(NamedTuple):
    """Where one fetch left the consumer's position in a partition, and the leader epoch
    of the last batch it read to get there: the last record's batch, or a transaction
    marker or aborted batch read after it. KIP-320's consumer commits that epoch with
    that position."""

    next_offset: int
    leader_epoch: int
