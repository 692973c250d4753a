"""Where one produced record goes, and what the sidecar writes beside it. Pure.

Every record of a managed topic carries the sidecar's stamp: the generation it was
routed with, that generation's undeleted partition count, the id of the sidecar that
produced it and that sidecar's sequence number (per process, from 0). It is written as
one header (names reserved: an app may not send ``ordered.*`` headers itself):

=======================  ==========================================================
``ordered.stamp``        ``<generation> <count> <sidecar> <sequence>``, ASCII, one
                         space between (a sidecar id has no space)
``ordered.relocation``   ``1`` on a relocation tombstone (DESIGN §7), never on app data
=======================  ==========================================================

or, with ``produce.header_format = "separate"``, as the four headers sidecars before
the stamp wrote and read: ``ordered.generation``, ``ordered.count``, ``ordered.sidecar``,
``ordered.sequence`` (ASCII decimals but the id). Readers accept both, so a rolling
upgrade runs the new version with ``separate`` until no old sidecar is left, then
switches. One header instead of four halves what the headers cost a consumer: aiokafka
decodes one tuple, not four, and a response carries one JSON object, not four.

With the sidecar id and sequence a consumer or the audit can order one producer's
records across partitions, and spot a record written across a barrier: its routing
generation is older than the generation its offset belongs to.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sidecar.core.errors import InvalidRecord, PartitionReadOnly, UnknownPartition
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.routing import partition_for_key

STAMP_HEADER: Final = "ordered.stamp"
GENERATION_HEADER: Final = "ordered.generation"
COUNT_HEADER: Final = "ordered.count"
SIDECAR_HEADER: Final = "ordered.sidecar"
SEQUENCE_HEADER: Final = "ordered.sequence"
RELOCATION_HEADER: Final = "ordered.relocation"
WARM_HEADER: Final = "ordered.warm"
"""On the aborted record a change writes to each partition it adds (never committed)."""

Header = tuple[str, bytes | None]


class HeaderFormat(enum.Enum):
    """How a managed record's stamp is written (``produce.header_format``)."""

    STAMP = "stamp"
    """One ``ordered.stamp`` header."""
    SEPARATE = "separate"
    """The four headers of sidecars before the stamp, for a rolling upgrade."""


@dataclass(frozen=True, slots=True)
class Stamp:
    """What the sidecar wrote beside a record of a managed topic."""

    generation: int
    count: int
    sidecar: str
    sequence: int


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
    generation: int,
    undeleted_count: int,
    sidecar_id: str,
    sequence: int,
    header_format: HeaderFormat = HeaderFormat.STAMP,
) -> list[Header]:
    if header_format is HeaderFormat.STAMP:
        return [
            (
                STAMP_HEADER,
                b"%d %d %s %d" % (generation, undeleted_count, sidecar_id.encode(), sequence),
            )
        ]
    return [
        (GENERATION_HEADER, str(generation).encode()),
        (COUNT_HEADER, str(undeleted_count).encode()),
        (SIDECAR_HEADER, sidecar_id.encode()),
        (SEQUENCE_HEADER, str(sequence).encode()),
    ]


def record_stamp(headers: Sequence[Header]) -> Stamp | None:
    """The stamp of a managed record, from either format; None if it has none or it is
    not one the sidecar writes (a record written around the sidecar)."""
    for name, value in headers:
        if name == STAMP_HEADER:
            return _parse_stamp(value)
    try:
        generation = header_int(headers, GENERATION_HEADER)
        count = header_int(headers, COUNT_HEADER)
        sequence = header_int(headers, SEQUENCE_HEADER)
    except ValueError:
        return None
    sidecar = header_value(headers, SIDECAR_HEADER)
    if generation is None or count is None or sequence is None or sidecar is None:
        return None
    return Stamp(generation, count, sidecar.decode(errors="replace"), sequence)


# Sets built once: a tuple of the names, written in the loop, is built again at every
# header (the names are module globals, not constants to the compiler).
_GENERATION_NAMES: Final = frozenset({STAMP_HEADER, GENERATION_HEADER})
_STAMP_NAMES: Final = frozenset({STAMP_HEADER, SIDECAR_HEADER})


def routed_generation(headers: Sequence[Header]) -> int | None:
    """The generation a record was routed with, from either format, or None. The consume
    path asks this of records one by one, so it reads no more than that."""
    for name, value in headers:
        if name in _GENERATION_NAMES:
            if value is None:
                return None
            text = value.partition(b" ")[0]
            return int(text) if text.isdigit() else None
    return None


def is_stamped(headers: Sequence[Header]) -> bool:
    """True if the record carries a sidecar's stamp, in either format."""
    # A loop, not any() over a generator: the consume path's metrics ask this of every
    # record of a managed topic, and the generator costs five times the test.
    for name, _ in headers:  # noqa: SIM110
        if name in _STAMP_NAMES:
            return True
    return False


def _parse_stamp(value: bytes | None) -> Stamp | None:
    if value is None:
        return None
    parts = bytes(value).split(b" ")
    if len(parts) != 4 or not (parts[0].isdigit() and parts[1].isdigit() and parts[3].isdigit()):
        return None
    return Stamp(int(parts[0]), int(parts[1]), parts[2].decode(errors="replace"), int(parts[3]))


def relocation_sources(
    *, log: GenerationLog, modes: Sequence[PartitionMode], key: bytes, partition: int
) -> list[int]:
    """Partitions other than ``partition`` where earlier generations routed ``key``,
    and which may still hold its data (not removed). Oldest generation first.

    These get a relocation tombstone on compacted topics (DESIGN §7), so compaction
    drops the key's stale value there. A compacted log names only the generations it
    keeps (``sidecar.core.compaction``): a partition only folded ones routed the key to
    holds none of its records any more.
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
