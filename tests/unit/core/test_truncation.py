"""Boundaries checked against truncation, against a partition whose every record is known.

The model partition keeps the identity of every record and its leader-epoch cache the
way a Kafka leader does: a new leader assigns its epoch at its log end; a replica elected
uncleanly has a prefix of the log and knows only the epochs of the records it has. The
answer to OffsetForLeaderEpoch follows Kafka's ``LeaderEpochFileCache.endOffsetFor``. The
reference for "truncated": a record below the boundary, present when the boundary was
read, is no longer at its offset.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.generations import Boundary, GenerationLog
from sidecar.core.truncation import (
    ConsumerTruncation,
    TruncatedBoundary,
    consumer_truncation,
    epochs_to_check,
    truncated_boundaries,
)

_ids = itertools.count()


@dataclass
class Partition:
    records: list[int] = field(default_factory=list)
    record_epochs: list[int] = field(default_factory=list)
    """The leader epoch each record was appended in (what its batch carries)."""
    epochs: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])
    """(epoch, start offset) of each epoch the leader knows, oldest first."""
    newest_epoch: int = 0

    def write(self, count: int) -> None:
        self.records.extend(next(_ids) for _ in range(count))
        self.record_epochs.extend([self.newest_epoch] * count)

    def clean_election(self) -> None:
        self.newest_epoch += 1
        self.epochs.append((self.newest_epoch, len(self.records)))

    def unclean_election(self, kept: int) -> None:
        """A replica that had only the first ``kept`` records becomes leader."""
        kept = min(kept, len(self.records))
        del self.records[kept:]
        del self.record_epochs[kept:]
        # It learnt an epoch from the records it fetched of it.
        self.epochs = [(epoch, start) for epoch, start in self.epochs if start < kept]
        self.newest_epoch += 1
        self.epochs.append((self.newest_epoch, kept))

    def end_of(self, asked: int) -> int | None:
        """OffsetForLeaderEpoch's end offset (None: UNDEFINED)."""
        if asked == self.epochs[-1][0]:
            return len(self.records)
        higher = [start for epoch, start in self.epochs if epoch > asked]
        if not higher:
            return None
        return higher[0]


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 5)),
        st.tuples(st.just("clean"), st.just(0)),
        st.tuples(st.just("unclean"), st.integers(0, 30)),
        st.tuples(st.just("boundary"), st.integers(0, 3)),
    ),
    max_size=40,
)


@given(_STEPS)
def test_a_boundary_is_reported_exactly_when_records_below_it_were_lost(
    steps: list[tuple[str, int]],
) -> None:
    partition = Partition()
    boundaries: list[Boundary] = []
    below: list[list[int]] = []
    for action, amount in steps:
        if action == "write":
            partition.write(amount)
        elif action == "clean":
            partition.clean_election()
        elif action == "unclean":
            partition.unclean_election(amount)
        else:
            # A stable offset, possibly trailing the log end (an open transaction).
            # Boundaries never move backwards: below the previous one (after a loss),
            # the change would carry the previous boundary, checked as that one.
            offset = max(len(partition.records) - amount, 0)
            if boundaries and offset < boundaries[-1].offset:
                continue
            boundaries.append(Boundary(offset, partition.newest_epoch))
            below.append(list(partition.records[:offset]))

    # Partition 0 is the model; partition 1 only lets the count change every generation.
    log = GenerationLog.start(1, [Boundary(0), Boundary(0)])
    for number, boundary in enumerate(boundaries, 1):
        log = log.append(log.next_generation(2 if number % 2 else 1, [boundary, Boundary(0)]))
    ends: dict[tuple[int, int], int | None] = {}
    for asked in epochs_to_check(log):
        for index, epoch in asked.items():
            assert (index, epoch) not in ends, "an epoch asked twice"
            ends[(index, epoch)] = partition.end_of(epoch)

    reported = {(t.generation, t.offset) for t in truncated_boundaries(log, ends)}
    expected = {
        (number, boundary.offset)
        for number, (boundary, records) in enumerate(zip(boundaries, below, strict=True), 1)
        if partition.records[: boundary.offset] != records
    }
    assert reported == expected


def test_the_report_names_the_boundary_and_where_its_epoch_ends() -> None:
    log = GenerationLog.start(2, [Boundary(0, 0), Boundary(0, 0)])
    log = log.append(log.next_generation(3, [Boundary(10, 2), Boundary(4, 1), Boundary(0, 0)]))
    assert epochs_to_check(log) == [{0: 2, 1: 1}]
    assert truncated_boundaries(log, {(0, 2): 7, (1, 1): 4}) == [
        TruncatedBoundary(generation=1, partition=0, offset=10, leader_epoch=2, log_end=7)
    ]
    # A leader that knows no epoch that new vouches for nothing.
    assert truncated_boundaries(log, {(0, 2): 10, (1, 1): None}) == [
        TruncatedBoundary(generation=1, partition=1, offset=4, leader_epoch=1, log_end=None)
    ]


def test_boundaries_without_an_epoch_or_at_zero_are_not_asked_about() -> None:
    log = GenerationLog.start(1, [Boundary(0), Boundary(0)])
    log = log.append(log.next_generation(2, [Boundary(5), Boundary(0, 3)]))
    assert epochs_to_check(log) == []
    assert truncated_boundaries(log, {}) == []


def test_each_epoch_of_a_partition_is_asked_in_its_own_round() -> None:
    log = GenerationLog.start(1, [Boundary(0, 0), Boundary(0, 0)])
    for count, offset, epoch in ((2, 3, 0), (1, 6, 1), (2, 9, 4)):
        log = log.append(log.next_generation(count, [Boundary(offset, epoch), Boundary(0, 0)]))
    assert epochs_to_check(log) == [{0: 0}, {0: 1}, {0: 4}]


# KIP-320 for consumers --------------------------------------------------------------------

_CONSUMER_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 5)),
        st.tuples(st.just("clean"), st.just(0)),
        st.tuples(st.just("unclean"), st.integers(0, 30)),
        st.tuples(st.just("consume"), st.integers(1, 6)),
        st.tuples(st.just("validate"), st.just(0)),
    ),
    max_size=50,
)


@settings(max_examples=500)
@given(_CONSUMER_STEPS)
def test_a_consumer_detects_exactly_the_loss_of_what_it_read_and_resumes_before_it(
    steps: list[tuple[str, int]],
) -> None:
    """The consumer reads records (remembering the epoch of the last one) and, after a
    leader change, validates its position before it reads again (KIP-320's order).
    Reference: what it read is no longer at the same offsets. When flagged, everything
    below ``resume_at`` is still what it read, so resuming there skips nothing written
    after the loss."""
    partition = Partition()
    read: list[int] = []
    last_epoch: int | None = None
    leader_changed = False
    for action, amount in steps:
        if action == "write":
            partition.write(amount)
        elif action == "clean":
            partition.clean_election()
            leader_changed = True
        elif action == "unclean":
            partition.unclean_election(amount)
            leader_changed = True
        elif action == "consume":
            if leader_changed:
                continue  # after a leader change it reads again only once validated
            position = len(read)
            taken = partition.records[position : position + amount]
            if taken:
                read += taken
                last_epoch = partition.record_epochs[len(read) - 1]
        else:
            leader_changed = False
            position = len(read)
            found = consumer_truncation(
                position,
                last_epoch,
                None if last_epoch is None else partition.end_of(last_epoch),
            )
            lost = partition.records[:position] != read
            assert (found is not None) == lost
            if found is None:
                continue
            resume_at = found.resume_at if found.resume_at is not None else 0
            assert resume_at <= position
            assert partition.records[:resume_at] == read[:resume_at]
            read = read[:resume_at]
            last_epoch = partition.record_epochs[resume_at - 1] if resume_at else None


def test_the_report_names_position_epoch_and_where_to_resume() -> None:
    assert consumer_truncation(10, 3, 10) is None
    assert consumer_truncation(10, 3, 25) is None
    found = consumer_truncation(10, 3, 7)
    assert found == ConsumerTruncation(position=10, leader_epoch=3, resume_at=7)
    assert found.lost == 3
    unknown = consumer_truncation(10, 3, None)
    assert unknown == ConsumerTruncation(position=10, leader_epoch=3, resume_at=None)
    assert unknown.lost is None


def test_a_position_without_an_epoch_is_not_validated() -> None:
    assert consumer_truncation(10, None, 0) is None
    assert consumer_truncation(10, -1, 0) is None
