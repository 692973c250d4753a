"""Compaction of the generation log: what may be folded, and that folding it changes no
decision about a record that is still there.

The properties run on simulated topics (``tests.support.simulated_topic``) through random
expansions and shrinks, while retention moves each partition's log start forward (never
past its end) and the log is compacted along the way, knowing only some log starts. The
compacted log is checked against the full one for every offset at or above the log
start: routing, generation_of, the gate's waits, and the hand-off's revocations.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.compaction import GroupHandoff, compact, foldable_count
from sidecar.core.gate import GroupProgress, Wait, gate, waits_into
from sidecar.core.generations import ChangeKind, FoldedWait, GenerationLog
from sidecar.core.handoff import (
    Revocation,
    is_gated,
    revocation_points,
    revocations_crossed,
    revocations_due,
    revoked_through,
)
from sidecar.core.placement import relocation_sources
from sidecar.core.routing import partition_for_key
from tests.support.retained_topic import (
    RetainedTopic,
    assert_same_decisions,
    retained_topics,
)
from tests.support.simulated_topic import (
    SimulatedTopic,
    modes_of,
    topics,
)


def assert_tombstones_dropped_had_nothing_to_delete(
    retained: RetainedTopic, compacted: GenerationLog
) -> None:
    """A relocation tombstone the compacted log no longer asks for would have gone to a
    partition that the kept generations never routed its key to, and whose records at
    or above the log start all belong to kept generations: none of them is the key's."""
    full = retained.full
    modes = modes_of(full)
    first = compacted.first_number
    for key in (bytes([k]) for k in range(64)):
        partition = partition_for_key(key, full.initial_count, full.current.undeleted_count)
        before = relocation_sources(log=full, modes=modes, key=key, partition=partition)
        after = relocation_sources(log=compacted, modes=modes, key=key, partition=partition)
        assert set(after) <= set(before)
        for dropped in set(before) - set(after):
            for generation in compacted.generations:
                count = generation.undeleted_count
                assert partition_for_key(key, full.initial_count, count) != dropped
            start = retained.log_start[dropped]
            if start < retained.end(dropped):
                assert full.generation_of(dropped, start) >= first


@settings(max_examples=200, deadline=None)
@given(retained=retained_topics())
def test_compaction_changes_no_decision_about_a_record_still_there(
    retained: RetainedTopic,
) -> None:
    assert_same_decisions(retained, retained.compacted)
    assert_tombstones_dropped_had_nothing_to_delete(retained, retained.compacted)
    # And once more, folded as far as every log start allows.
    first = foldable_count(retained.compacted, retained.starts, groups=())
    folded = compact(retained.compacted, first)
    assert_same_decisions(retained, folded)
    assert_tombstones_dropped_had_nothing_to_delete(retained, folded)


@st.composite
def groups_of(draw: st.DrawFn, retained: RetainedTopic) -> GroupHandoff:
    """A consumer group at any point: committed offsets in some partitions, and the
    revocations it acknowledged (all of them, or any few)."""
    full = retained.full
    partitions = range(full.current.physical_count)
    committed = {
        p: draw(st.integers(0, retained.end(p))) for p in draw(st.sets(st.sampled_from(partitions)))
    }
    every = sorted(
        (p, r.generation) for p in partitions for r in revocation_points(full, p) if r.boundary > 0
    )
    acknowledged: set[tuple[int, int]] = set(every)
    if every and not draw(st.booleans()):
        acknowledged = draw(st.sets(st.sampled_from(every)))
    return GroupHandoff(committed, frozenset(acknowledged))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), retained=retained_topics())
def test_a_known_group_meets_the_same_gate_and_hand_off(
    data: st.DataObject, retained: RetainedTopic
) -> None:
    full = retained.full
    group = data.draw(groups_of(retained))
    first = foldable_count(full, retained.starts, groups=[group])
    compacted = compact(full, first)
    # No change is folded while the group owes one of its revocations...
    for partition in group.committed:
        for revocation in revocation_points(full, partition):
            if revocation.generation <= first and revocation.boundary > 0:
                assert (partition, revocation.generation) in group.acknowledged
    # ... and no more is kept than that and the log starts require.
    if first < foldable_count(full, retained.starts, groups=()):
        owed = [
            (p, first + 1)
            for p in group.committed
            if (p, first + 1) not in group.acknowledged
            and any(
                r.generation == first + 1 and r.boundary > 0 for r in revocation_points(full, p)
            )
        ]
        assert owed
    acknowledged = group.acknowledged
    through = revoked_through(full, acknowledged)
    through_compacted = revoked_through(compacted, acknowledged)
    for partition in group.committed:
        assert through_compacted[partition] == through[partition]
    modes = modes_of(full)
    before = GroupProgress(group.committed, retained.starts, modes, through)
    after = GroupProgress(group.committed, retained.starts, modes, through_compacted)
    for partition in range(full.current.physical_count):
        start, end = retained.log_start[partition], retained.end(partition)
        for offset in range(start, end):
            assert gate(compacted, after, partition, offset) == gate(
                full, before, partition, offset
            )
        if partition not in group.committed:
            continue
        for delivered in range(start, end + 1):
            assert revocations_due(compacted, partition, delivered, acknowledged) == (
                revocations_due(full, partition, delivered, acknowledged)
            )
            # A commit crosses the same revocations it must wait for.
            crossed = [
                [
                    r
                    for r in revocations_crossed(
                        log, partition, group.committed[partition], delivered
                    )
                    if (partition, r.generation) not in acknowledged
                ]
                for log in (full, compacted)
            ]
            assert crossed[0] == crossed[1]


@settings(deadline=None)
@given(retained=retained_topics())
def test_compacting_again_or_from_the_full_log_gives_the_same_log(retained: RetainedTopic) -> None:
    first = foldable_count(retained.compacted, retained.starts, groups=())
    assert first == foldable_count(retained.full, retained.starts, groups=())
    once = compact(retained.compacted, first)
    assert compact(once, first) is once
    assert foldable_count(once, retained.starts, groups=()) == first
    assert once == compact(retained.full, first)
    # Folded in steps, as retention moved on, or at once: one log.
    for step in range(retained.compacted.first_number, first + 1):
        assert compact(compact(retained.full, step), first) == once


@given(topic=topics())
def test_the_current_generation_is_never_folded(topic: SimulatedTopic) -> None:
    log = topic.log
    # Every record removed: everything but the current generation folds.
    gone = {p: len(records) for p, records in enumerate(topic.partitions)}
    first = foldable_count(log, gone, groups=())
    assert first == log.current.number
    assert compact(log, first).generations == (log.current,)
    with pytest.raises(ValueError, match="never folded"):
        compact(log, log.current.number + 1)


@given(topic=topics())
def test_without_retention_no_generation_after_a_record_is_folded(topic: SimulatedTopic) -> None:
    # A compacted topic keeps its log start at 0: only changes made before the first
    # record was written (every boundary at 0) fold, and they gate nothing.
    log = topic.log
    first = foldable_count(log, dict.fromkeys(range(log.current.physical_count), 0), groups=())
    for generation in log.generations[: first + 1]:
        assert all(boundary.offset == 0 for boundary in generation.boundaries)
    if first < log.current.number:
        assert any(boundary.offset > 0 for boundary in log[first + 1].boundaries)


def test_a_topic_written_before_its_first_change_is_not_compacted_without_retention() -> None:
    topic = SimulatedTopic.create(2)
    topic.produce(5)
    topic.change_count(3)
    topic.change_count(2)
    assert foldable_count(topic.log, {0: 0, 1: 0, 2: 0}, groups=()) == 0


def test_a_partition_whose_log_start_is_unknown_stops_the_fold() -> None:
    topic = SimulatedTopic.create(1)
    topic.produce(1)
    topic.change_count(2)  # generation 1: boundaries (1, 0)
    topic.produce(2)
    topic.change_count(4)  # generation 2: boundaries (2, 0, 0, 0); 2 and 3 are new
    gone = {0: 2, 1: 0, 2: 0, 3: 0}
    assert foldable_count(topic.log, gone, groups=()) == 2
    assert foldable_count(topic.log, {0: 2, 1: 0, 2: 0}, groups=()) == 1
    assert foldable_count(topic.log, {1: 0, 2: 0, 3: 0}, groups=()) == 0


def _expanded_after_four_records() -> SimulatedTopic:
    """N=1: four records of key 1 in partition 0, then 1 -> 2 moves key 1 to partition 1
    (boundary 4 in partition 0), where one more record of it is written."""
    topic = SimulatedTopic.create(1)
    for _ in range(4):
        topic.produce(1)
    topic.change_count(2)
    topic.produce(1)
    assert topic.partitions == [[(1, 0), (1, 1), (1, 2), (1, 3)], [(1, 4)]]
    return topic


def test_folding_a_generation_whose_boundary_is_above_the_log_start_changes_decisions() -> None:
    """Too eager: retention removed three of partition 0's four records, and generation 1
    begins at 4 there. Folding generation 0 anyway loses what record 3 still needs."""
    log = _expanded_after_four_records().log
    starts = {0: 3, 1: 0}
    assert foldable_count(log, starts, groups=()) == 0
    eager = compact(log, 1)
    # Record 3 no longer has a generation ...
    assert log.generation_of(0, 3) == 0
    with pytest.raises(ValueError, match="below its first boundary"):
        eager.generation_of(0, 3)
    # ... its consumer is not told keys_revoked once it delivered it ...
    assert revocations_due(log, 0, 4, set()) == [Revocation(0, 1, 4)]
    assert revocations_due(eager, 0, 4, set()) == []
    # ... and partition 1's record is delivered before that was acknowledged.
    caught_up = {0: 4}
    modes = modes_of(log)
    held = GroupProgress(caught_up, starts, modes, revoked_through(log, set()))
    assert gate(log, held, 1, 0).unmet == (Wait(0, 4, 1, ChangeKind.EXPANSION),)
    opened = GroupProgress(caught_up, starts, modes, revoked_through(eager, set()))
    assert gate(eager, opened, 1, 0).open


def test_a_group_that_read_records_retention_removed_keeps_its_revocations() -> None:
    """Too eager, the other way: every record below the boundary is gone, but the group
    committed partition 0 at 2 before retention removed the rest. It holds state for
    key 1 and must be told keys_revoked(0, 1) before partition 1's record is delivered;
    folding generation 0 waits until it acknowledged."""
    log = _expanded_after_four_records().log
    starts = {0: 4, 1: 0}
    read_then_removed = GroupHandoff({0: 2}, frozenset())
    assert foldable_count(log, starts, groups=[read_then_removed]) == 0
    assert foldable_count(log, starts, groups=[GroupHandoff({0: 2}, {(0, 1)})]) == 1
    # A group that never committed in partition 0 never read it: nothing to tell.
    assert foldable_count(log, starts, groups=[GroupHandoff({1: 0}, frozenset())]) == 1
    eager = compact(log, 1)
    modes = modes_of(log)
    held = GroupProgress({0: 2}, starts, modes, revoked_through(log, set()))
    assert not gate(log, held, 1, 0).open
    assert revocations_due(log, 0, 4, set()) == [Revocation(0, 1, 4)]
    opened = GroupProgress({0: 2}, starts, modes, revoked_through(eager, set()))
    assert gate(eager, opened, 1, 0).open
    assert revocations_due(eager, 0, 4, set()) == []


def test_a_record_gated_only_by_folded_changes_stays_gated() -> None:
    """The folded waits are what keeps keys_assigned: partition 1's newer records are
    gated by change 1 alone, which is folded with generation 1; dropped instead of kept,
    its wait would leave them ungated."""
    topic = _expanded_after_four_records()
    topic.change_count(3)  # generation 2: boundaries (4, 1, 0), a new partition 2
    topic.produce(1)
    log = topic.log
    starts = {0: 4, 1: 1, 2: 0}
    assert foldable_count(log, starts, groups=()) == 2
    compacted = compact(log, 2)
    assert compacted.folded_waits == (
        FoldedWait(1, 0, 4, 1, ChangeKind.EXPANSION),
        FoldedWait(2, 0, 4, 2, ChangeKind.EXPANSION),  # the new 2 took keys of 0 too
    )
    assert is_gated(log, 1, 2)
    assert is_gated(compacted, 1, 2)
    assert waits_into(compacted, 1, 2) == waits_into(log, 1, 2)
    without_them = GenerationLog.after_fold(1, log[2], [])
    assert not is_gated(without_them, 1, 2)
