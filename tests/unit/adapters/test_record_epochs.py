"""Record leader epochs read out of fetched batches (``sidecar.adapters.record_epochs``).

The batches are built by aiokafka's own builders (v2, and legacy v1), with the leader
epoch a broker would have stamped written into the header: the epoch is not covered by
the batch's CRC, exactly so that a leader can set it on append. A transaction marker
is a transactional batch of one control record, its control flag set as the broker
sets it (the flag is covered by the CRC, so the CRC is computed again).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

import pytest
from aiokafka.consumer import fetcher as aiokafka_fetcher
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from sidecar.adapters import record_epochs
from sidecar.adapters.record_epochs import (
    NO_EPOCH,
    EpochMemoryRecords,
    EpochPartitionRecords,
    batch_epochs,
    install,
    last_batch_of,
    leader_epoch_of,
)

READ_COMMITTED = 1


PRODUCER_ID = 4000


def v2_batch(
    base_offset: int, values: Sequence[bytes], leader_epoch: int, *, transactional: bool = False
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=int(transactional),
        producer_id=PRODUCER_ID if transactional else -1,
        producer_epoch=0 if transactional else -1,
        base_sequence=0 if transactional else -1,
        batch_size=1 << 20,
    )
    for index, value in enumerate(values):
        builder.append(index, timestamp=1_700_000_000_000, key=b"k", value=value, headers=[])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    struct.pack_into(">i", data, 12, leader_epoch)  # as the leader stamps it on append
    return bytes(data)


def commit_marker(offset: int, leader_epoch: int) -> bytes:
    """The COMMIT control batch a transaction coordinator has the leader append."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=1,
        producer_id=PRODUCER_ID,
        producer_epoch=0,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    # Key: version 0, type 1 (COMMIT); value: version 0, coordinator epoch 0.
    builder.append(
        0, timestamp=1_700_000_000_000, key=b"\x00\x00\x00\x01", value=b"\0" * 6, headers=[]
    )
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, offset)
    struct.pack_into(">i", data, 12, leader_epoch)
    # v2 batch header: BaseOffset, Length, PartitionLeaderEpoch, Magic, then the CRC
    # (at 17) of everything from Attributes (at 21) on; bit 5 of Attributes: control.
    attributes = struct.unpack_from(">h", data, 21)[0]
    struct.pack_into(">h", data, 21, attributes | 0x20)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


def v1_batch(offset: int, value: bytes) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=1_700_000_000_000, key=b"k", value=value)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, offset)
    return bytes(data)


@pytest.fixture
def installed() -> Iterator[None]:
    saved = (aiokafka_fetcher.MemoryRecords, aiokafka_fetcher.PartitionRecords)
    saved_update = aiokafka_fetcher.FetchResult.__dict__["_update_position"]
    install()
    install()  # idempotent
    try:
        yield
    finally:
        aiokafka_fetcher.MemoryRecords, aiokafka_fetcher.PartitionRecords = saved
        aiokafka_fetcher.FetchResult._update_position = saved_update


def fetched(data: bytes, fetch_offset: int = 0) -> list[object]:
    """What aiokafka's fetcher makes of one partition's fetched bytes, once installed."""
    records = aiokafka_fetcher.MemoryRecords(data)
    partition_records = aiokafka_fetcher.PartitionRecords(
        TopicPartition("t", 0), records, [], fetch_offset, None, None, True, READ_COMMITTED
    )
    return list(partition_records)


def test_aiokafka_still_builds_its_fetch_results_from_the_names_replaced() -> None:
    # The extension replaces two module names aiokafka's fetcher looks up on every fetch,
    # and the method its results move the position with; if aiokafka renames them,
    # records and positions would silently lose their epochs.
    import inspect

    source = inspect.getsource(aiokafka_fetcher.Fetcher._proc_fetch_request)
    assert "MemoryRecords(part_data[-1])" in source
    assert "PartitionRecords(" in source
    assert "self._consumer_record(tp, record)" in inspect.getsource(
        record_epochs._PARTITION_RECORDS._unpack_records
    )
    results = inspect.getsource(aiokafka_fetcher.FetchResult)
    assert results.count("self._update_position()") == 3  # getone, getall twice
    assert "state.consumed_to(self._partition_records.next_fetch_offset)" in results


def test_every_record_carries_the_epoch_of_its_batch(installed: None) -> None:
    data = (
        v2_batch(0, [b"a", b"b"], leader_epoch=3)
        + v2_batch(2, [b"c"], leader_epoch=3)
        + v2_batch(3, [b"d", b"e", b"f"], leader_epoch=7)
    )
    records = fetched(data)
    assert [(r.offset, leader_epoch_of(r)) for r in records] == [  # type: ignore[attr-defined]
        (0, 3),
        (1, 3),
        (2, 3),
        (3, 7),
        (4, 7),
        (5, 7),
    ]


def test_records_below_the_fetch_offset_are_skipped_and_the_epochs_stay_aligned(
    installed: None,
) -> None:
    data = v2_batch(0, [b"a", b"b", b"c"], leader_epoch=1) + v2_batch(3, [b"d"], leader_epoch=2)
    records = fetched(data, fetch_offset=2)
    assert [(r.offset, leader_epoch_of(r)) for r in records] == [(2, 1), (3, 2)]  # type: ignore[attr-defined]


def test_a_batch_cut_off_at_the_end_of_the_fetch_is_neither_read_nor_counted(
    installed: None,
) -> None:
    whole = v2_batch(0, [b"a"], leader_epoch=4)
    cut = v2_batch(1, [b"b", b"c"], leader_epoch=5)
    data = whole + cut[: len(cut) - 3]
    assert batch_epochs(data) == [4]
    assert [(r.offset, leader_epoch_of(r)) for r in fetched(data)] == [(0, 4)]  # type: ignore[attr-defined]


def test_legacy_batches_have_no_epoch(installed: None) -> None:
    data = v1_batch(0, b"a") + v1_batch(1, b"b")
    assert batch_epochs(data) == [NO_EPOCH, NO_EPOCH]
    assert [leader_epoch_of(r) for r in fetched(data)] == [NO_EPOCH, NO_EPOCH]


def test_a_record_not_read_here_has_no_epoch() -> None:
    assert leader_epoch_of(object()) == NO_EPOCH


def test_the_wrapper_reads_what_aiokafkas_reader_reads() -> None:
    data = v2_batch(10, [b"x"], leader_epoch=2) + v2_batch(11, [b"y"], leader_epoch=9)
    wrapped = EpochMemoryRecords(data)
    assert wrapped.size_in_bytes() == len(data)
    seen = []
    while wrapped.has_next():
        batch = wrapped.next_batch()
        seen.append((batch.base_offset, wrapped.batch_epoch))
    assert seen == [(10, 2), (11, 9)]
    assert wrapped.next_batch() is None
    assert issubclass(EpochPartitionRecords, record_epochs._PARTITION_RECORDS)


@given(
    st.lists(st.tuples(st.integers(1, 4), st.integers(-1, 2**31 - 1), st.booleans()), max_size=8),
    st.integers(0, 40),
)
def test_epochs_follow_batches_of_any_shape_and_any_cut(
    shapes: list[tuple[int, int, bool]], cut: int
) -> None:
    data = b""
    expected: list[int] = []
    offset = 0
    for count, epoch, legacy in shapes:
        if legacy:
            data += v1_batch(offset, b"v")
            offset += 1
            expected.append(NO_EPOCH)
        else:
            data += v2_batch(offset, [b"v"] * count, epoch)
            offset += count
            expected.append(epoch)
    # Cutting bytes off the end drops exactly the batches no longer whole.
    kept = data[: max(0, len(data) - cut)]
    whole = [e for e, end in zip(expected, _batch_ends(shapes), strict=True) if end <= len(kept)]
    assert batch_epochs(kept) == whole


def _batch_ends(shapes: list[tuple[int, int, bool]]) -> list[int]:
    ends, size, offset = [], 0, 0
    for count, epoch, legacy in shapes:
        size += len(v1_batch(offset, b"v") if legacy else v2_batch(offset, [b"v"] * count, epoch))
        offset += 1 if legacy else count
        ends.append(size)
    return ends


def handed_out(
    data: bytes, fetch_offset: int = 0, max_records: int | None = None
) -> tuple[list[object], tuple[int, int] | None]:
    """What the consumer's ``getmany`` hands out of one partition's fetched bytes (at
    most ``max_records``), once installed, and the position and last batch's epoch it
    leaves on the partition's state."""
    tp = TopicPartition("t", 0)
    subscription = SubscriptionState()
    subscription.assign_from_user({tp})
    assignment = subscription.subscription.assignment
    state = assignment.state_value(tp)
    state.seek(fetch_offset)
    partition_records = aiokafka_fetcher.PartitionRecords(
        tp,
        aiokafka_fetcher.MemoryRecords(data),
        [],
        fetch_offset,
        None,
        None,
        True,
        READ_COMMITTED,
    )
    result = aiokafka_fetcher.FetchResult(
        tp, assignment=assignment, partition_records=partition_records, backoff=0
    )
    records = result.getall(max_records)
    last = last_batch_of(state)
    assert last is None or last[0] == state.position
    return records, last


async def test_a_position_past_a_marker_carries_the_markers_epoch(installed: None) -> None:
    # A transaction's records written under epoch 3; the leader changed before its
    # commit marker was written, under epoch 4.
    data = v2_batch(0, [b"a", b"b"], leader_epoch=3, transactional=True) + commit_marker(
        2, leader_epoch=4
    )
    records, last = handed_out(data)
    assert [(r.offset, leader_epoch_of(r)) for r in records] == [(0, 3), (1, 3)]  # type: ignore[attr-defined]
    assert last == (3, 4)


async def test_a_fetch_of_a_marker_alone_moves_the_position_with_its_epoch(
    installed: None,
) -> None:
    records, last = handed_out(commit_marker(7, leader_epoch=2), fetch_offset=7)
    assert records == []
    assert last == (8, 2)


async def test_a_position_within_a_fetch_carries_the_epoch_of_the_last_record(
    installed: None,
) -> None:
    data = v2_batch(0, [b"a", b"b"], leader_epoch=3) + v2_batch(2, [b"c"], leader_epoch=5)
    records, last = handed_out(data, max_records=2)
    assert len(records) == 2
    assert last == (2, 3)
