"""The positions model (``sidecar.core.positions``) against a reference that knows every
record.

A simulated Kafka consumer with aiokafka's semantics (assignments that start from the
group's committed offset, fetches that return while a rebalance or a seek runs, markers
and aborted records that take offsets) is driven through random interleavings of
fetches, rebalances, seeks, releases, responses sent or lost and commits. The reference
records every record sent to the app; the property: no commit ever passes a record that
was never sent (only markers, aborted records and relocation tombstones may be passed),
and once the faults stop every record reaches the app.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from sidecar.core.consume import TopicPartition
from sidecar.core.positions import Fetch, Positions

PARTITIONS = (TopicPartition("t", 0), TopicPartition("t", 1))
RECORD, MARKER, ABORTED, TOMBSTONE = "record", "marker", "aborted", "tombstone"


@dataclass(frozen=True)
class Record:
    offset: int
    kind: str
    partition: int = 0


@dataclass
class SimulatedConsumer:
    """aiokafka's group consumer as the instance sees it, for one group of one member."""

    logs: dict[TopicPartition, list[str]]
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    incarnation: int = 1
    assignment: set[TopicPartition] = field(default_factory=lambda: set(PARTITIONS))
    positions: dict[TopicPartition, int | None] = field(default_factory=dict)
    rebalancing: bool = False
    """Between the revocation and the next assignment: aiokafka's old assignment is still
    current, and its fetches wait for the new one."""

    def reset_positions(self) -> None:
        for tp in self.assignment:
            if self.positions.get(tp) is None:
                self.positions[tp] = self.committed.get(tp, 0)

    def drain(self, seek_epoch: int, most: int) -> Fetch[Record]:
        """What a getmany returns: up to ``most`` log entries a partition, read from its
        position, less markers and aborted records; the positions right after."""
        batches: dict[TopicPartition, list[Record]] = {}
        for tp in sorted(self.assignment):
            position = self.positions.get(tp)
            if position is None:
                continue
            log = self.logs[tp]
            end = min(len(log), position + most)
            records = [
                Record(offset, log[offset], tp.partition)
                for offset in range(position, end)
                if log[offset] in (RECORD, TOMBSTONE)
            ]
            if records:
                batches[tp] = records
            self.positions[tp] = end
        known = {tp: p for tp, p in self.positions.items() if p is not None}
        return Fetch(self.incarnation, seek_epoch, batches, known)

    def assign_anew(self, partitions: set[TopicPartition]) -> None:
        self.incarnation += 1
        self.assignment = partitions
        self.positions = {}
        self.rebalancing = False


logs_strategy = st.lists(
    st.sampled_from([RECORD, RECORD, RECORD, MARKER, ABORTED, TOMBSTONE]), min_size=0, max_size=25
)


class PositionsAgainstReference(RuleBasedStateMachine):
    """One instance: the model, the simulated consumer, and the reference of sent records."""

    def __init__(self) -> None:
        super().__init__()
        self.model: Positions[Record] = Positions()
        self.consumer: SimulatedConsumer | None = None
        self.pending: Fetch[Record] | None = None
        """A fetch that returned and was not taken yet (the Fetcher leaves it running)."""
        self.response: list[Record] = []
        self.responding = False
        """A response is being built or written (it may hold only skipped records)."""
        self.sent: dict[TopicPartition, set[int]] = {tp: set() for tp in PARTITIONS}
        self.excused: dict[TopicPartition, set[int]] = {tp: set() for tp in PARTITIONS}
        """Records the app chose to skip by seeking past them."""

    @rule(log0=logs_strategy, log1=logs_strategy)
    @precondition(lambda self: self.consumer is None)
    def start(self, log0: list[str], log1: list[str]) -> None:
        self.consumer = SimulatedConsumer({PARTITIONS[0]: log0, PARTITIONS[1]: log1})
        self.model.follow(self.consumer.assignment, self.consumer.incarnation)

    def _consumer(self) -> SimulatedConsumer:
        assert self.consumer is not None
        return self.consumer

    # The consumer's side ---------------------------------------------------------------

    @rule()
    @precondition(lambda self: self.consumer is not None and not self.consumer.rebalancing)
    def positions_reset(self) -> None:
        self._consumer().reset_positions()

    @rule(most=st.integers(1, 8))
    @precondition(
        lambda self: (
            self.consumer is not None and not self.consumer.rebalancing and self.pending is None
        )
    )
    def fetch_returns(self, most: int) -> None:
        self.pending = self._consumer().drain(self.model.seek_epoch, most)

    @rule()
    @precondition(lambda self: self.consumer is not None)
    def fetcher_runs(self) -> None:
        """The Fetcher's step: follow the assignment, then take a returned fetch."""
        consumer = self._consumer()
        self.model.follow(consumer.assignment, consumer.incarnation)
        if self.pending is not None:
            self._take(self.pending)
            self.pending = None

    @rule()
    @precondition(lambda self: self.consumer is not None and not self.consumer.rebalancing)
    def rebalance_revokes(self) -> None:
        """The revocation listener: commit what was delivered, then forget everything."""
        consumer = self._consumer()
        for tp, state in self.model.items():
            if state.delivered is not None and tp in consumer.assignment:
                self._commit(tp, state.delivered)
        self.model.revoked(consumer.incarnation)
        consumer.rebalancing = True

    @rule(partitions=st.sets(st.sampled_from(PARTITIONS)))
    @precondition(lambda self: self.consumer is not None and self.consumer.rebalancing)
    def rebalance_assigns(self, partitions: set[TopicPartition]) -> None:
        consumer = self._consumer()
        consumer.assign_anew(partitions)
        self.model.follow(consumer.assignment, consumer.incarnation)

    @rule(data=st.data(), landed_late=st.booleans())
    @precondition(lambda self: self.consumer is not None and not self.consumer.rebalancing)
    def app_seeks(self, data: st.DataObject, landed_late: bool) -> None:
        consumer = self._consumer()
        assigned = sorted(tp for tp in consumer.assignment if tp in self.model)
        if not assigned:
            return
        tp = data.draw(st.sampled_from(assigned))
        target = data.draw(st.integers(0, len(consumer.logs[tp])))
        state = self.model.get(tp)
        assert state is not None
        # Seeking forward skips records by the app's choice.
        start = state.delivered if state.delivered is not None else consumer.committed.get(tp, 0)
        self.excused[tp].update(range(start, target))
        self.model.begin_seek(tp, consumer.incarnation)
        consumer.positions[tp] = target
        if landed_late and self.pending is None:
            # A fetch from the new position returns before the seek's caller goes on.
            self.pending = consumer.drain(self.model.seek_epoch, 3)
            self._take(self.pending)
            self.pending = None
        self.model.seek_landed(tp, target)

    def _take(self, fetch: Fetch[Record]) -> None:
        """``take``, checking that ``reading_of`` named, beforehand, the reading the
        fetch's records went into (or that they were dropped)."""
        readings = {
            tp: self.model.reading_of(tp, fetch.incarnation, fetch.seek_epoch)
            for tp in fetch.batches
        }
        dropped = {d.tp for d in self.model.take(fetch)}
        for tp, reading in readings.items():
            state = self.model.get(tp)
            if reading is None:
                assert tp in dropped
            else:
                assert tp not in dropped
                assert state is not None
                assert (state.incarnation, state.seek_stamp) == reading

    # The release path's side --------------------------------------------------------------

    @rule(most=st.integers(1, 6))
    @precondition(lambda self: self.consumer is not None and not self.responding)
    def release(self, most: int) -> None:
        self.responding = True
        for tp, state in self.model.items():
            for _ in range(most):
                if not state.buffer:
                    break
                head = state.buffer[0]
                if head.kind == TOMBSTONE:
                    self.model.skip(tp)
                else:
                    self.response.append(self.model.release(tp))

    @rule()
    @precondition(lambda self: self.responding)
    def response_sent(self) -> None:
        for record in self.response:
            self.sent[PARTITIONS[record.partition]].add(record.offset)
        self.model.sent()
        self.response, self.responding = [], False

    @rule()
    @precondition(lambda self: self.responding)
    def response_lost(self) -> None:
        self.model.unsent()
        self.response, self.responding = [], False

    @rule(data=st.data())
    @precondition(lambda self: self.consumer is not None and not self.consumer.rebalancing)
    def app_commits(self, data: st.DataObject) -> None:
        candidates = [
            (tp, state.delivered) for tp, state in self.model.items() if state.delivered is not None
        ]
        if not candidates:
            return
        tp, offset = data.draw(st.sampled_from(candidates))
        self._commit(tp, offset)

    def _commit(self, tp: TopicPartition, offset: int) -> None:
        assert self.model.committable(tp, offset)
        self._consumer().committed[tp] = offset
        self.model.committed(tp, offset)
        self._check_commit(tp, offset)

    def _check_commit(self, tp: TopicPartition, offset: int) -> None:
        log = self._consumer().logs[tp]
        never_sent = [
            o
            for o in range(min(offset, len(log)))
            if log[o] == RECORD and o not in self.sent[tp] and o not in self.excused[tp]
        ]
        assert not never_sent, f"{tp} committed {offset} past records never sent: {never_sent}"

    @invariant()
    def model_invariants(self) -> None:
        self.model.check()

    def teardown(self) -> None:
        """Faults stop: the loop runs until the group has everything; all was sent."""
        consumer = self.consumer
        if consumer is None:
            return
        if self.responding:
            self.response_lost()
        if consumer.rebalancing:
            consumer.assign_anew(set(PARTITIONS))
        elif consumer.assignment != set(PARTITIONS):
            self.rebalance_revokes()
            consumer.assign_anew(set(PARTITIONS))
        self.model.follow(consumer.assignment, consumer.incarnation)
        for _ in range(200):
            consumer.reset_positions()
            self.fetcher_runs()
            self.pending = consumer.drain(self.model.seek_epoch, 8)
            self.fetcher_runs()
            self.release(50)
            self.response_sent()
            for tp, state in self.model.items():
                if state.delivered is not None:
                    self._commit(tp, state.delivered)
            if all(consumer.committed.get(tp, 0) >= len(consumer.logs[tp]) for tp in PARTITIONS):
                break
        for tp in PARTITIONS:
            log = consumer.logs[tp]
            missing = [
                o
                for o, kind in enumerate(log)
                if kind == RECORD and o not in self.sent[tp] and o not in self.excused[tp]
            ]
            assert not missing, f"{tp}: records never sent: {missing}"
            assert consumer.committed.get(tp, 0) >= len(log), f"{tp}: the group never caught up"


TestPositionsAgainstReference = PositionsAgainstReference.TestCase
TestPositionsAgainstReference.settings = settings(
    max_examples=400, stateful_step_count=60, deadline=None
)


# Examples: the cases the chaos runs found, each named after what failed.

TP = PARTITIONS[0]


def _records(*offsets: int) -> list[Record]:
    return [Record(o, RECORD) for o in offsets]


def test_a_position_of_the_revoked_assignment_never_counts_as_delivered() -> None:
    """Chaos run: a fetch of 11768..11817 returned, a rebalance revoked the partition, a
    state made before the new assignment took the old assignment's position (11820) and
    the refetch from the committed offset was discarded as seen: 59 records lost."""
    model: Positions[Record] = Positions()
    model.follow({TP}, 1)
    model.take(Fetch(1, 0, {}, {TP: 100}))
    returned = Fetch(1, 0, {TP: _records(100, 101, 102)}, {TP: 105})
    model.revoked(1)  # the listener committed 100 and forgot the partition
    model.follow({TP}, 1)  # aiokafka's old assignment is still current
    assert TP not in model
    assert model.take(returned)[0].reason == "its assignment was revoked"
    model.follow({TP}, 2)  # the new assignment starts from the committed offset
    model.take(Fetch(2, 0, {TP: _records(100, 101, 102)}, {TP: 105}))
    state = model.get(TP)
    assert state is not None
    assert [r.offset for r in state.buffer] == [100, 101, 102]
    assert state.delivered == 100


def test_a_commit_during_a_response_being_written_stops_below_it() -> None:
    model: Positions[Record] = Positions()
    model.follow({TP}, 1)
    model.take(Fetch(1, 0, {TP: _records(5, 6)}, {TP: 8}))
    model.release(TP)
    model.release(TP)
    state = model.get(TP)
    assert state is not None
    assert state.delivered == 5
    assert not model.committable(TP, 7)
    model.sent()
    assert state.delivered == 8  # past the marker at 7
    assert state.sent_to == 7


def test_a_response_not_sent_puts_its_records_and_skips_back() -> None:
    model: Positions[Record] = Positions()
    model.follow({TP}, 1)
    model.take(Fetch(1, 0, {TP: [Record(0, TOMBSTONE), *_records(1)]}, {TP: 2}))
    model.skip(TP)
    model.release(TP)
    model.unsent()
    state = model.get(TP)
    assert state is not None
    assert [r.offset for r in state.buffer] == [0, 1]
    assert state.delivered == 0


def test_a_fetch_that_returned_before_a_seek_is_dropped() -> None:
    model: Positions[Record] = Positions()
    model.follow({TP}, 1)
    returned = Fetch(1, model.seek_epoch, {TP: _records(50, 51)}, {TP: 52})
    model.seek(TP, 10, 1)
    assert model.take(returned)[0].reason == "the partition was sought"
    state = model.get(TP)
    assert state is not None
    assert (state.fetched, state.delivered, list(state.buffer)) == (10, 10, [])


def test_a_seek_whose_fetch_came_first_keeps_the_fetch() -> None:
    model: Positions[Record] = Positions()
    model.follow({TP}, 1)
    model.begin_seek(TP, 1)
    model.take(Fetch(1, model.seek_epoch, {TP: _records(3, 4)}, {TP: 5}))
    model.seek_landed(TP, 0)
    state = model.get(TP)
    assert state is not None
    assert [r.offset for r in state.buffer] == [3, 4]
    assert state.delivered == 3


def test_a_fetch_of_a_newer_assignment_makes_its_state_before_the_listener_runs() -> None:
    model: Positions[Record] = Positions()
    model.follow({TP}, 1)
    model.take(Fetch(2, 0, {TP: _records(7)}, {TP: 8}))
    state = model.get(TP)
    assert state is not None
    assert state.incarnation == 2
    model.follow({TP}, 2)
    assert model.get(TP) is state
    # A fetch of the older assignment, returning late, is dropped.
    assert model.take(Fetch(1, 0, {TP: _records(1)}, {TP: 2}))[0].reason == (
        "the consumer was assigned anew"
    )


def test_a_commit_past_delivered_is_refused() -> None:
    model: Positions[Record] = Positions()
    model.follow({TP}, 1)
    model.take(Fetch(1, 0, {TP: _records(0)}, {TP: 1}))
    with pytest.raises(ValueError, match="passes delivered"):
        model.committed(TP, 1)


@given(st.lists(st.integers(0, 40), unique=True, min_size=1).map(sorted), st.integers(0, 5))
def test_records_that_come_again_after_a_position_moved_back_are_taken_once(
    offsets: list[int], back: int
) -> None:
    model: Positions[Record] = Positions()
    model.follow({TP}, 1)
    model.take(Fetch(1, 0, {TP: _records(*offsets)}, {TP: offsets[-1] + 1}))
    again = offsets[max(0, len(offsets) - back) :]
    model.take(Fetch(1, 0, {TP: _records(*again)}, {TP: offsets[-1] + 1}))
    state = model.get(TP)
    assert state is not None
    assert [r.offset for r in state.buffer] == offsets
    model.check()
