"""The leader epoch a commit carries (``sidecar.core.commit_epochs``).

Examples, then the module's two promises checked on generated logs read in generated
fetches, against a reference that knows every batch: a commit never carries an epoch
older than the batch below it (a validation would find a loss that is not one) nor
newer than a batch read at or after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.commit_epochs import CommitEpochs
from sidecar.core.consume import LastBatch, TopicPartition

TP = TopicPartition("t", 0)


@dataclass(frozen=True)
class Record:
    offset: int
    epoch: int


def _epoch(record: Record) -> int:
    return record.epoch


def _records(epoch: int, *offsets: int) -> list[Record]:
    return [Record(offset, epoch) for offset in offsets]


def test_a_commit_past_a_marker_carries_the_markers_epoch() -> None:
    # A transaction's records 0..4 under epoch 1; the leader changed before its commit
    # marker (offset 5) was written, under epoch 2.
    epochs = CommitEpochs()
    epochs.read(TP, 1, 0, _records(1, 0, 1, 2, 3, 4), _epoch, LastBatch(6, 2))
    assert epochs.epoch_for(TP, 1, 6) == 2
    assert epochs.epoch_for(TP, 1, 5) == 1
    assert epochs.epoch_for(TP, 1, 1) == 1


def test_a_gap_between_epochs_is_given_to_the_newer_one() -> None:
    # 5 is a marker of epoch 1 or 2: not seen. Committing 6 with epoch 2 is never found
    # truncated (2 wrote 6); with 1 it would be if the marker was 2's.
    epochs = CommitEpochs()
    epochs.read(TP, 1, 3, [*_records(1, 3, 4), *_records(2, 6, 7)], _epoch, LastBatch(8, 2))
    assert [epochs.epoch_for(TP, 1, o) for o in range(3, 10)] == [None, 1, 1, 2, 2, 2, None]


def test_what_lies_before_the_first_record_read_is_given_to_its_epoch() -> None:
    # Read from 10: 10 and 11 are markers or aborted batches (of epoch 2 or older).
    epochs = CommitEpochs()
    epochs.read(TP, 1, 10, _records(2, 12, 13), _epoch, LastBatch(14, 2))
    assert [epochs.epoch_for(TP, 1, o) for o in range(10, 15)] == [None, 2, 2, 2, 2]
    # Where reading started is not known: from the first record on only.
    epochs = CommitEpochs()
    epochs.read(TP, 1, None, _records(2, 12, 13), _epoch, LastBatch(14, 2))
    assert [epochs.epoch_for(TP, 1, o) for o in range(10, 15)] == [None, None, None, 2, 2]


def test_a_seek_out_of_what_was_read_starts_over() -> None:
    epochs = CommitEpochs()
    epochs.read(TP, 1, 0, _records(1, 0, 1, 2), _epoch, LastBatch(3, 1))
    epochs.read(TP, 1, 1, _records(1, 1, 2, 3), _epoch, LastBatch(4, 1))  # a seek back
    assert [epochs.epoch_for(TP, 1, o) for o in range(0, 6)] == [None, 1, 1, 1, 1, None]
    epochs.read(TP, 1, 10, _records(2, 10), _epoch, LastBatch(11, 2))  # a seek past it
    assert [epochs.epoch_for(TP, 1, o) for o in (4, 10, 11)] == [None, None, 2]


def test_offsets_outside_what_was_read_carry_no_epoch() -> None:
    epochs = CommitEpochs()
    assert epochs.epoch_for(TP, 1, 5) is None
    epochs.read(TP, 1, 10, _records(1, 10, 11), _epoch, LastBatch(12, 1))
    assert epochs.epoch_for(TP, 1, 10) is None  # 9 was not read
    assert epochs.epoch_for(TP, 1, 13) is None  # 12 was not read
    assert epochs.epoch_for(TP, 2, 12) is None  # another assignment


def test_a_new_assignment_starts_over() -> None:
    epochs = CommitEpochs()
    epochs.read(TP, 1, 0, _records(1, 0, 1), _epoch, None)
    epochs.read(TP, 2, 7, _records(3, 7, 8), _epoch, None)
    assert epochs.epoch_for(TP, 1, 2) is None
    assert epochs.epoch_for(TP, 2, 2) is None
    assert epochs.epoch_for(TP, 2, 9) == 3


def test_records_read_again_change_nothing() -> None:
    epochs = CommitEpochs()
    epochs.read(TP, 1, 0, _records(1, 0, 1, 2), _epoch, LastBatch(3, 1))
    # aiokafka reset the position to 1 (out of range); the same records again.
    epochs.read(TP, 1, 1, [*_records(1, 1, 2), *_records(2, 3)], _epoch, LastBatch(4, 2))
    assert [epochs.epoch_for(TP, 1, o) for o in range(1, 5)] == [1, 1, 1, 2]


def test_a_truncation_cuts_back_to_where_reading_resumes() -> None:
    epochs = CommitEpochs()
    epochs.read(TP, 1, 0, [*_records(1, 0, 1, 2), *_records(2, 3, 4)], _epoch, LastBatch(5, 2))
    epochs.cut(TP, 1, 3)
    assert [epochs.epoch_for(TP, 1, o) for o in range(1, 6)] == [1, 1, 1, None, None]
    # Read again from 3: another leader's records (the new log).
    epochs.read(TP, 1, 3, _records(4, 3, 4), _epoch, LastBatch(5, 4))
    assert [epochs.epoch_for(TP, 1, o) for o in range(3, 6)] == [1, 4, 4]
    epochs.cut(TP, 1, 0)
    assert epochs.epoch_for(TP, 1, 3) is None
    epochs.read(TP, 1, 0, _records(4, 0), _epoch, LastBatch(1, 4))
    assert epochs.epoch_for(TP, 1, 1) == 4


def test_a_reading_from_the_commit_starts_with_the_committed_epoch() -> None:
    epochs = CommitEpochs()
    epochs.start_at_commit(TP, 1, 10, 3)
    assert epochs.epoch_for(TP, 1, 10) == 3
    epochs.read(TP, 1, 10, _records(4, 12, 13), _epoch, LastBatch(14, 4))
    assert [epochs.epoch_for(TP, 1, o) for o in range(10, 15)] == [3, 4, 4, 4, 4]
    epochs.start_at_commit(TP, 1, 14, 9)  # what was read is known better
    assert epochs.epoch_for(TP, 1, 14) == 4


def test_batches_without_an_epoch_give_commits_none() -> None:
    epochs = CommitEpochs()
    epochs.read(TP, 1, 0, _records(-1, 0, 1), _epoch, None)
    assert epochs.epoch_for(TP, 1, 2) is None
    epochs.read(TP, 1, 2, _records(0, 2, 3), _epoch, None)
    assert epochs.epoch_for(TP, 1, 2) is None
    assert epochs.epoch_for(TP, 1, 4) == 0


# On generated logs ----------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    base: int
    count: int
    epoch: int
    control: bool

    @property
    def end(self) -> int:
        return self.base + self.count


def _log(shapes: list[tuple[int, bool, bool]]) -> list[Batch]:
    """Batches in offset order: (records, a leader change before it, a marker)."""
    log, offset, epoch = [], 0, 0
    for count, new_leader, control in shapes:
        epoch += new_leader
        size = 1 if control else count
        log.append(Batch(offset, size, epoch, control))
        offset += size
    return log


def _fetch(
    log: list[Batch], position: int, batches: int, max_records: int | None
) -> tuple[list[Record], LastBatch | None]:
    """What the consumer's fetcher hands out from ``position``: the ``batches`` batches
    from the one holding it, markers skipped, at most ``max_records`` records."""
    first = next((i for i, b in enumerate(log) if b.end > position), len(log))
    records: list[Record] = []
    last: LastBatch | None = None
    for batch in log[first : first + batches]:
        if batch.control:
            last = LastBatch(batch.end, batch.epoch)
            continue
        for offset in range(max(batch.base, position), batch.end):
            records.append(Record(offset, batch.epoch))
            last = LastBatch(offset + 1, batch.epoch)
            if max_records is not None and len(records) == max_records:
                return records, last
        last = LastBatch(batch.end, batch.epoch)
    return records, last


@given(
    st.lists(st.tuples(st.integers(1, 4), st.booleans(), st.booleans()), min_size=1, max_size=12),
    st.integers(0, 6),
    st.lists(st.tuples(st.integers(1, 3), st.none() | st.integers(1, 5)), max_size=10),
    st.booleans(),
)
def test_a_commit_carries_an_epoch_between_the_batch_below_it_and_the_next_one_read(
    shapes: list[tuple[int, bool, bool]],
    start: int,
    fetches: list[tuple[int, int | None]],
    hide_last_batches: bool,
) -> None:
    log = _log(shapes)
    epoch_at = {o: b.epoch for b in log for o in range(b.base, b.end)}
    start = min(start, log[-1].end)
    epochs = CommitEpochs()
    position = start
    seen: set[int] = set()
    for batches, max_records in fetches:
        records, last = _fetch(log, position, batches, max_records)
        if hide_last_batches:
            last = None  # only what the records tell
        epochs.read(TP, 1, position, records, _epoch, last)
        seen |= {r.offset for r in records}
        if last is not None:
            seen.add(last.next_offset - 1)
            position = last.next_offset
        elif records:
            position = records[-1].offset + 1
    for offset in range(0, log[-1].end + 2):
        carried = epochs.epoch_for(TP, 1, offset)
        if carried is None:
            continue
        below = offset - 1
        assert start <= below < position, (offset, carried)
        # Never older than the batch below the offset: no loss found that is not one.
        assert carried >= epoch_at[below], (offset, carried)
        # Never newer than a batch read at or after it: a cut log is found.
        assert carried <= epoch_at[min(o for o in seen if o >= below)], (offset, carried)
        if below in seen:
            assert carried == epoch_at[below]
    if not hide_last_batches and position > start:
        # Everything read can be committed with an epoch.
        assert all(epochs.epoch_for(TP, 1, o) is not None for o in range(start + 1, position + 1))
