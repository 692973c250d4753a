"""Where one produced record goes, and what the sidecar writes beside it. Pure.

Headers on every record of a managed topic (names reserved: an app may not send
``ordered.*`` headers itself):

=======================  ==========================================================
``ordered.generation``   generation the record was routed with (ASCII decimal)
``ordered.count``        undeleted partition count of that generation
``ordered.sidecar``      id of the sidecar that produced it
``ordered.sequence``     that sidecar's sequence number (per process, from 0)
``ordered.relocation``   ``1`` on a relocation tombstone (DESIGN §7), never on app data
=======================  ==========================================================

With the sidecar id and sequence a consumer or the audit can order one producer's
records across partitions, and spot a record written across a barrier: its
``ordered.generation`` is older than the generation its offset belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from sidecar.core.errors import InvalidRecord, PartitionReadOnly, UnknownPartition
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.routing import partition_for_key

GENERATION_HEADER: Final = "ordered.generation"
COUNT_HEADER: Final = "ordered.count"
SIDECAR_HEADER: Final = "ordered.sidecar"
SEQUENCE_HEADER: Final = "ordered.sequence"
RELOCATION_HEADER: Final = "ordered.relocation"

Header = tuple[str, bytes | None]


def header_value(headers: Sequence[Header], name: str) -> bytes | None:
    """The value of the first header called ``name``, or None (absent, or null).

    The one reader of the headers this module writes: the consume path, the Kafka
    gateway and the audit read them through here.
    """
    for key, value in headers:
        if key == name:
            return bytes(value) if value is not None else None
    return None


def header_int(headers: Sequence[Header], name: str) -> int | None:
    """A header this module writes as an ASCII decimal (generation, count, sequence)."""
    value = header_value(headers, name)
    return None if value is None else int(value)


def place_record(
    *,
    log: GenerationLog,
    modes: Sequence[PartitionMode],
    key: bytes | None,
    explicit_partition: int | None,
    unkeyed_index: int,
) -> int:
    """The partition a record goes to under the log's current generation.

    An explicit partition must exist and be read-write. A keyed record goes where
    linear hashing puts its key; an unkeyed one round-robins over the read-write
    partitions, ``unkeyed_index`` picking which. Raises UnknownPartition,
    PartitionReadOnly, or InvalidRecord (a tombstone without a key).
    """
    undeleted = log.current.undeleted_count
    if explicit_partition is not None:
        if not 0 <= explicit_partition < len(modes):
            raise UnknownPartition(f"partition {explicit_partition} does not exist")
        mode = modes[explicit_partition]
        if mode is PartitionMode.REMOVED:
            raise UnknownPartition(f"partition {explicit_partition} was removed")
        if mode is PartitionMode.READ_ONLY:
            raise PartitionReadOnly(
                f"partition {explicit_partition} is read-only: it is being retired"
            )
        return explicit_partition
    if key is not None:
        return partition_for_key(key, log.initial_count, undeleted)
    # Partitions below U are read-write by construction (modes_after_commit).
    return unkeyed_index % undeleted


def require_key_for_tombstone(key: bytes | None, value: bytes | None, index: int) -> None:
    """A tombstone deletes a key; without one Kafka would refuse it (and aiokafka asserts)."""
    if key is None and value is None:
        raise InvalidRecord(f"record {index}: a null value (tombstone) needs a key")


def sidecar_headers(
    generation: int, undeleted_count: int, sidecar_id: str, sequence: int
) -> list[Header]:
    return [
        (GENERATION_HEADER, str(generation).encode()),
        (COUNT_HEADER, str(undeleted_count).encode()),
        (SIDECAR_HEADER, sidecar_id.encode()),
        (SEQUENCE_HEADER, str(sequence).encode()),
    ]


def relocation_sources(
    *, log: GenerationLog, modes: Sequence[PartitionMode], key: bytes, partition: int
) -> list[int]:
    """Partitions other than ``partition`` where earlier generations routed ``key``,
    and which may still hold its data (not removed). Oldest generation first.

    These get a relocation tombstone on compacted topics (DESIGN §7), so compaction
    drops the key's stale value there.
    """
    sources: list[int] = []
    for generation in log.generations[:-1]:
        old = partition_for_key(key, log.initial_count, generation.undeleted_count)
        if old == partition or old in sources:
            continue
        if old < len(modes) and modes[old] is PartitionMode.REMOVED:
            continue
        sources.append(old)
    return sources
