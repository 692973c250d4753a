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

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.generations import Boundary, GenerationLog
from sidecar.core.truncation import TruncatedBoundary, epochs_to_check, truncated_boundaries

_ids = itertools.count()


@dataclass
class Partition:
    records: list[int] = field(default_factory=list)
    epochs: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])
    """(epoch, start offset) of each epoch the leader knows, oldest first."""
    newest_epoch: int = 0

    def write(self, count: int) -> None:
        self.records.extend(next(_ids) for _ in range(count))

    def clean_election(self) -> None:
        self.newest_epoch += 1
        self.epochs.append((self.newest_epoch, len(self.records)))

    def unclean_election(self, kept: int) -> None:
        """A replica that had only the first ``kept`` records becomes leader."""
        kept = min(kept, len(self.records))
        del self.records[kept:]
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
