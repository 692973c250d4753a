from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import InvalidRecord, PartitionReadOnly, UnknownPartition
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode, modes_after_commit
from sidecar.core.placement import (
    place_record,
    relocation_sources,
    require_key_for_tombstone,
    sidecar_headers,
)
from sidecar.core.routing import partition_for_key

RW, RO, REMOVED = PartitionMode.READ_WRITE, PartitionMode.READ_ONLY, PartitionMode.REMOVED


def _log(*counts: int) -> GenerationLog:
    log = GenerationLog.start(counts[0])
    for count in counts[1:]:
        physical = max(count, log.current.physical_count)
        log = log.append(
            log.next_generation(count, [Boundary(10 * log.current.number + 10)] * physical)
        )
    return log


def test_explicit_partitions_must_exist_and_be_writable() -> None:
    log = _log(2, 4)
    modes = (RW, RW, RO, REMOVED)
    assert place_record(log=log, modes=modes, key=b"k", explicit_partition=1, unkeyed_index=0) == 1
    with pytest.raises(PartitionReadOnly):
        place_record(log=log, modes=modes, key=None, explicit_partition=2, unkeyed_index=0)
    with pytest.raises(UnknownPartition, match="removed"):
        place_record(log=log, modes=modes, key=None, explicit_partition=3, unkeyed_index=0)
    with pytest.raises(UnknownPartition, match="does not exist"):
        place_record(log=log, modes=modes, key=None, explicit_partition=4, unkeyed_index=0)


@given(st.binary(min_size=0, max_size=20), st.integers(0, 1000))
def test_keyed_records_follow_linear_hashing_and_unkeyed_stay_below_the_count(
    key: bytes, index: int
) -> None:
    log = _log(3, 5)
    modes = (RW,) * 5
    assert place_record(
        log=log, modes=modes, key=key, explicit_partition=None, unkeyed_index=index
    ) == partition_for_key(key, 3, 5)
    assert place_record(
        log=log, modes=modes, key=None, explicit_partition=None, unkeyed_index=index
    ) in range(5)


def test_a_tombstone_needs_a_key() -> None:
    require_key_for_tombstone(b"k", None, 0)
    require_key_for_tombstone(None, b"v", 0)
    with pytest.raises(InvalidRecord, match="record 3"):
        require_key_for_tombstone(None, None, 3)


def test_headers_carry_generation_count_sidecar_and_sequence() -> None:
    assert sidecar_headers(4, 7, "sc-1", 12) == [
        ("ordered.generation", b"4"),
        ("ordered.count", b"7"),
        ("ordered.sidecar", b"sc-1"),
        ("ordered.sequence", b"12"),
    ]


@given(st.binary(min_size=1, max_size=12), st.lists(st.integers(2, 16), min_size=1, max_size=5))
def test_relocation_sources_are_the_keys_earlier_partitions(key: bytes, changes: list[int]) -> None:
    counts = [2]
    for count in changes:
        if count != counts[-1]:
            counts.append(count)
    log = _log(*counts)
    modes: tuple[PartitionMode, ...] = (RW,) * 2
    for generation in log.generations[1:]:
        modes = modes_after_commit(modes, generation)
    target = partition_for_key(key, 2, counts[-1])
    sources = relocation_sources(log=log, modes=modes, key=key, partition=target)
    earlier = {partition_for_key(key, 2, c) for c in counts[:-1]}
    assert target not in sources
    assert len(sources) == len(set(sources))
    assert set(sources) == {p for p in earlier - {target} if modes[p] is not REMOVED}
