from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import InvalidRecord, PartitionReadOnly, UnknownPartition
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode, modes_after_commit
from sidecar.core.placement import (
    HeaderFormat,
    Stamp,
    is_stamped,
    place_record,
    record_stamp,
    relocation_sources,
    require_key_for_tombstone,
    routed_generation,
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


def test_the_stamp_is_one_header_of_generation_count_sidecar_and_sequence() -> None:
    assert sidecar_headers(4, 7, "sc-1", 12) == [("ordered.stamp", b"4 7 sc-1 12")]
    assert sidecar_headers(4, 7, "sc-1", 12, HeaderFormat.SEPARATE) == [
        ("ordered.generation", b"4"),
        ("ordered.count", b"7"),
        ("ordered.sidecar", b"sc-1"),
        ("ordered.sequence", b"12"),
    ]


_SIDECAR_IDS = st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True)
_APP_HEADERS = st.lists(
    st.tuples(
        st.from_regex(r"[a-z][a-z.]{0,12}", fullmatch=True), st.none() | st.binary(max_size=8)
    ),
    max_size=3,
)


@given(
    st.integers(0, 10**6),
    st.integers(1, 10**4),
    _SIDECAR_IDS,
    st.integers(0, 2**63),
    st.sampled_from(HeaderFormat),
    _APP_HEADERS,
)
def test_either_format_reads_back_as_the_stamp_written(
    generation: int,
    count: int,
    sidecar: str,
    sequence: int,
    header_format: HeaderFormat,
    app_headers: list[tuple[str, bytes | None]],
) -> None:
    """A reader of this version reads what either format wrote, among the app's own
    headers (which never start with ``ordered.``: produce refuses those)."""
    headers = [*app_headers, *sidecar_headers(generation, count, sidecar, sequence, header_format)]
    assert record_stamp(headers) == Stamp(generation, count, sidecar, sequence)
    assert routed_generation(headers) == generation
    assert is_stamped(headers)


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("app", b"1")],
        [("ordered.stamp", None)],
        [("ordered.stamp", b"4 7 sc-1")],
        [("ordered.stamp", b"4 7 sc 1 12")],
        [("ordered.stamp", b"x 7 sc-1 12")],
        [("ordered.stamp", b"-4 7 sc-1 12")],
        [("ordered.generation", b"4"), ("ordered.sidecar", b"sc-1")],
        [
            ("ordered.generation", b"four"),
            ("ordered.count", b"7"),
            ("ordered.sidecar", b"sc-1"),
            ("ordered.sequence", b"12"),
        ],
    ],
)
def test_a_stamp_the_sidecar_does_not_write_is_no_stamp(
    headers: list[tuple[str, bytes | None]],
) -> None:
    """Records written around the sidecar may carry anything; they are read as unstamped,
    never as an error that would stop a partition's delivery."""
    assert record_stamp(headers) is None


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
