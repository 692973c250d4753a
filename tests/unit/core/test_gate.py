"""The gate predicate: waits implied by expansions and shrinks, and a simulated group.

The simulation is the invariant checker: a single producer writes keyed, numbered
records routed by linear hashing through a random sequence of expansions and shrinks
(boundaries are the partition ends at each change, as the barrier reads them); a
consumer group then delivers, commits and acknowledges key revocations in an
adversarial order chosen by hypothesis, taking only records the gate lets through and
acknowledging only the revocations due. It must (1) never get stuck while records
remain (no wait cycle), (2) deliver every key's records in production order, and (3)
hand keys off in order: every revocation of a source up to a change acknowledged before
a record that waits on it is delivered, each acknowledged once.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.gate import GroupProgress, Wait, direct_waits, gate, waits_into
from sidecar.core.generations import (
    Boundary,
    ChangeKind,
    FoldedGeneration,
    FoldedWait,
    GenerationLog,
    PartitionMode,
)
from sidecar.core.handoff import revocation_points, revocations_due, revoked_through
from sidecar.core.routing import expansion_blocker, shrink_blockers
from tests.support.simulated_topic import SimulatedTopic, modes_of, topics

RW, RO, REMOVED = PartitionMode.READ_WRITE, PartitionMode.READ_ONLY, PartitionMode.REMOVED


def naive_direct_waits(log: GenerationLog, partition: int, generation: int) -> list[Wait]:
    """``direct_waits`` by its definition: one pass over changes ``1..generation``."""
    waits = []
    for number in range(1, generation + 1):
        old_count = log[number - 1].undeleted_count
        new_count = log[number].undeleted_count
        if new_count > old_count:
            if not old_count <= partition < new_count:
                continue
            sources = [expansion_blocker(partition, log.initial_count, old_count)]
            kind = ChangeKind.EXPANSION
        elif partition < new_count:
            sources = shrink_blockers(partition, log.initial_count, old_count, new_count)
            kind = ChangeKind.SHRINK
        else:
            continue
        for source in sources:
            boundary = log[number].boundary(source)
            assert boundary is not None
            waits.append(Wait(source, boundary, number, kind))
    return waits


def every_wait_into(log: GenerationLog, partition: int, generation: int) -> list[Wait]:
    """Every direct wait reachable from ``(partition, generation)``, none merged: the
    oracle the gate's one-wait-per-source reduction is checked against."""
    found: list[Wait] = []
    seen: set[tuple[int, int]] = set()
    pending = [(partition, generation)]
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        for wait in naive_direct_waits(log, *node):
            found.append(wait)
            pending.append((wait.source, wait.generation - 1))
    return found


@settings(max_examples=300, deadline=None)
@given(topic=topics(), data=st.data())
def test_gated_group_delivers_everything_in_per_key_order(
    topic: SimulatedTopic, data: st.DataObject
) -> None:
    log, partitions = topic.log, topic.partitions
    delivered = [0] * len(partitions)
    committed: dict[int, int] = {}
    acknowledged: set[tuple[int, int]] = set()
    last_sequence: dict[int, int] = {}
    modes = modes_of(log)
    total = sum(len(records) for records in partitions)
    count = 0
    while count < total:
        progress = GroupProgress(
            committed=dict(committed),
            log_start={},
            modes=modes,
            revoked_through=revoked_through(log, acknowledged),
        )
        deliverable = [
            p
            for p in range(len(partitions))
            if delivered[p] < len(partitions[p]) and gate(log, progress, p, delivered[p]).open
        ]
        committable = [p for p in range(len(partitions)) if committed.get(p, 0) < delivered[p]]
        due = [
            (p, revocation.generation)
            for p in range(len(partitions))
            for revocation in revocations_due(log, p, delivered[p], acknowledged)
        ]
        # A stuck group with nothing left to commit or acknowledge would be a wait cycle.
        assert deliverable or committable or due, f"stuck with {total - count} records left"
        actions = (
            [("deliver", p) for p in deliverable]
            + [("commit", p) for p in committable]
            + [("acknowledge", i) for i in range(len(due))]
        )
        action, index = data.draw(st.sampled_from(actions))
        if action == "acknowledge":
            assert due[index] not in acknowledged, "a revocation told twice"
            acknowledged.add(due[index])
            continue
        partition = index
        if action == "commit":
            committed[partition] = delivered[partition]
            continue
        generation = log.generation_of(partition, delivered[partition])
        for wait in every_wait_into(log, partition, generation):
            # Hand-off order: the keys' previous partition told its app they moved away.
            for revocation in revocation_points(log, wait.source):
                if revocation.generation <= wait.generation and revocation.boundary > 0:
                    assert (wait.source, revocation.generation) in acknowledged
        key, sequence = partitions[partition][delivered[partition]]
        assert sequence == last_sequence.get(key, -1) + 1, f"key {key} out of order"
        last_sequence[key] = sequence
        delivered[partition] += 1
        count += 1


def test_without_the_gate_the_simulation_breaks_order() -> None:
    # The checker above can fail: deliver the new partition first and order breaks.
    topic = SimulatedTopic.create(1)
    topic.produce(1)  # partition 0 under U=1
    topic.change_count(2)
    topic.produce(1)  # partition 1 under U=2
    assert topic.partitions == [[(1, 0)], [(1, 1)]]
    progress = GroupProgress(committed={}, log_start={}, modes=modes_of(topic.log))
    decision = gate(topic.log, progress, 1, 0)
    assert not decision.open
    assert decision.unmet == (Wait(source=0, boundary=1, generation=1, kind=ChangeKind.EXPANSION),)


def test_expansion_new_partition_waits_on_its_one_blocker() -> None:
    log = GenerationLog.start(2, [Boundary(0), Boundary(0)])
    log = log.append(log.next_generation(3, [Boundary(10), Boundary(20), Boundary(0)]))
    assert waits_into(log, 2, 1) == (Wait(0, 10, 1, ChangeKind.EXPANSION),)
    # Old partitions only lose keys: nothing to wait for.
    assert waits_into(log, 0, 1) == ()
    assert waits_into(log, 1, 1) == ()
    lagging = GroupProgress(committed={0: 9}, log_start={}, modes=[RW, RW, RW])
    assert gate(log, lagging, 2, 0).unmet == (Wait(0, 10, 1, ChangeKind.EXPANSION),)
    caught_up = GroupProgress(committed={0: 10}, log_start={}, modes=[RW, RW, RW])
    assert gate(log, caught_up, 2, 0).open


def test_shrink_remaining_partition_is_free_below_its_boundary() -> None:
    log = GenerationLog.start(2)
    log = log.append(log.next_generation(4, [Boundary(0)] * 4))
    log = log.append(log.next_generation(2, [Boundary(5), Boundary(6), Boundary(7), Boundary(8)]))
    progress = GroupProgress(committed={}, log_start={}, modes=[RW, RW, RO, RO])
    # Offset 4 of partition 0 is generation 1: no shrink wait applies.
    assert gate(log, progress, 0, 4).open
    # Offset 5 is generation 2: waits on retired partition 2 (its child).
    assert gate(log, progress, 0, 5).unmet == (Wait(2, 7, 2, ChangeKind.SHRINK),)
    assert gate(log, progress, 1, 6).unmet == (Wait(3, 8, 2, ChangeKind.SHRINK),)


def test_log_start_and_removed_partitions_count_as_consumed() -> None:
    log = GenerationLog.start(1)
    log = log.append(log.next_generation(2, [Boundary(4), Boundary(0)]))
    truncated = GroupProgress(committed={}, log_start={0: 4}, modes=[RW, RW])
    assert gate(log, truncated, 1, 0).open
    removed = GroupProgress(committed={}, log_start={}, modes=[REMOVED, RW])
    assert gate(log, removed, 1, 0).open
    neither = GroupProgress(committed={0: 3}, log_start={0: 3}, modes=[RW, RW])
    assert not gate(log, neither, 1, 0).open


def test_records_the_group_read_before_retention_removed_them_still_need_the_hand_off() -> None:
    """Seen in a chaos run: retention moved a source's log start past its boundary after
    the group had read it, and the destination opened before keys_revoked was told."""
    log = GenerationLog.start(1)
    log = log.append(log.next_generation(2, [Boundary(4), Boundary(0)]))
    read_then_removed = GroupProgress(
        committed={0: 2}, log_start={0: 6}, modes=[RW, RW], revoked_through={0: 0, 1: 1}
    )
    assert gate(log, read_then_removed, 1, 0).unmet == (Wait(0, 4, 1, ChangeKind.EXPANSION),)
    told = GroupProgress(
        committed={0: 2}, log_start={0: 6}, modes=[RW, RW], revoked_through={0: 1, 1: 1}
    )
    assert gate(log, told, 1, 0).open
    never_read = GroupProgress(
        committed={}, log_start={0: 6}, modes=[RW, RW], revoked_through={0: 0, 1: 1}
    )
    assert gate(log, never_read, 1, 0).open


def test_of_two_waits_on_one_boundary_the_newer_change_counts() -> None:
    """Seen in a chaos run: partition 2 got nothing between two shrinks that both moved
    its keys to 0, so both waits sat at one boundary; the gate kept the older one and
    opened once its keys_revoked was acknowledged, before the newer one's was told."""
    log = GenerationLog.start(2)
    log = log.append(log.next_generation(3, [Boundary(0)] * 3))
    log = log.append(log.next_generation(2, [Boundary(5), Boundary(5), Boundary(7)]))
    log = log.append(log.next_generation(3, [Boundary(5), Boundary(5), Boundary(7)]))
    log = log.append(log.next_generation(2, [Boundary(6), Boundary(6), Boundary(7)]))
    assert [(r.generation, r.boundary) for r in revocation_points(log, 2)] == [(2, 7), (4, 7)]
    assert [w for w in waits_into(log, 0, 4) if w.source == 2] == [Wait(2, 7, 4, ChangeKind.SHRINK)]
    modes, committed = [RW, RW, RO], {0: 6, 1: 6, 2: 7}
    older_told = GroupProgress(
        committed=committed,
        log_start={},
        modes=modes,
        revoked_through=revoked_through(log, {(0, 3), (2, 2)}),
    )
    assert gate(log, older_told, 0, 6).unmet == (Wait(2, 7, 4, ChangeKind.SHRINK),)
    both_told = GroupProgress(
        committed=committed,
        log_start={},
        modes=modes,
        revoked_through=revoked_through(log, {(0, 3), (2, 2), (2, 4)}),
    )
    assert gate(log, both_told, 0, 6).open


@given(topic=topics())
def test_waits_into_is_the_strongest_reachable_wait_per_source(topic: SimulatedTopic) -> None:
    # Checked against the definition: every direct wait reachable by the plain closure,
    # the newest of the highest boundary per source, offset-0 waits left out.
    log = topic.log
    for generation in log.generations:
        for partition in range(generation.physical_count):
            assert list(direct_waits(log, partition, generation.number)) == (
                naive_direct_waits(log, partition, generation.number)
            )
            strongest: dict[int, Wait] = {}
            for wait in every_wait_into(log, partition, generation.number):
                held = strongest.get(wait.source)
                if held is None or (wait.boundary, wait.generation) > (
                    held.boundary,
                    held.generation,
                ):
                    strongest[wait.source] = wait
            expected = tuple(strongest[s] for s in sorted(strongest) if strongest[s].boundary > 0)
            # On a fresh log (no memo) and on the one already asked about older nodes.
            fresh = GenerationLog(log.initial_count, log.generations)
            assert waits_into(fresh, partition, generation.number) == expected
            assert waits_into(log, partition, generation.number) == expected


def test_waits_into_a_long_log_is_quick_to_compute() -> None:
    # A topic changed a thousand times: the closure is computed once per (partition,
    # change into it), not once per node and older change (that took seconds per log).
    topic = SimulatedTopic.create(2)
    counts = [3, 7, 2, 12, 5, 9, 4, 11, 6, 2, 10, 8]
    for number in range(1000):
        target = counts[number % len(counts)]
        if target == topic.log.current.undeleted_count:
            target += 1
        for key in range(number % 40):
            topic.produce(key)
        topic.change_count(target)
    log = topic.log
    for partition in range(log.current.physical_count):
        for generation in range(log.current.number - 50, log.current.number + 1):
            for wait in waits_into(log, partition, generation):
                assert wait.generation <= generation
    memo: dict[tuple[int, int], object] = log.derived(("strongest_waits",), dict)
    table: dict[int, tuple[list[int], list[object]]] = log.derived(("direct_wait_table",), dict)
    changes_into = sum(len(numbers) for numbers, _ in table.values())
    assert 0 < len(memo) <= changes_into


@given(topic=topics())
def test_every_wait_points_at_strictly_older_records(topic: SimulatedTopic) -> None:
    log = topic.log
    for partition in range(log.current.physical_count):
        for generation in range(log.current.number + 1):
            if log[generation].boundary(partition) is None:
                continue
            for wait in waits_into(log, partition, generation):
                assert wait.generation <= generation
                # Records below the boundary belong to generations before the change.
                if wait.boundary > 0:
                    assert log.generation_of(wait.source, wait.boundary - 1) < wait.generation


def test_waits_are_inherited_through_a_partition_without_records_of_the_key() -> None:
    # Found by the simulation: key 3 goes 3 (U=4) -> 0 (U=1) -> 1 (U=2) with nothing
    # written while U=1. Partition 1 must wait on partition 3, not only on 0.
    topic = SimulatedTopic.create(1)
    topic.change_count(4)
    topic.produce(3)
    topic.change_count(1)
    topic.change_count(2)
    topic.produce(3)
    assert topic.partitions == [[], [(3, 1)], [], [(3, 0)]]
    progress = GroupProgress(committed={}, log_start={}, modes=modes_of(topic.log))
    assert gate(topic.log, progress, 1, 0).unmet == (Wait(3, 1, 2, ChangeKind.SHRINK),)
    drained = GroupProgress(committed={3: 1}, log_start={}, modes=modes_of(topic.log))
    assert gate(topic.log, drained, 1, 0).open


@given(topic=topics())
def test_every_wait_is_on_a_revocation_of_its_source(topic: SimulatedTopic) -> None:
    """The gate waits for acknowledgements the owner of the source can give: each wait's
    change moved keys away from its source, so it is one of the source's revocations."""
    log = topic.log
    for partition in range(log.current.physical_count):
        for generation in range(log.current.number + 1):
            if log[generation].boundary(partition) is None:
                continue
            for wait in waits_into(log, partition, generation):
                points = {(r.generation, r.boundary) for r in revocation_points(log, wait.source)}
                assert (wait.generation, wait.boundary) in points


def test_a_caught_up_group_is_told_the_revocation_and_the_gate_waits_for_it() -> None:
    """Seen on a real cluster: a group that had committed the blocker up to the boundary
    before the change committed never heard keys_revoked, yet the new partition opened."""
    log = GenerationLog.start(1)
    log = log.append(log.next_generation(2, [Boundary(4), Boundary(0)]))
    # The group delivered and committed partition 0 to its end (4) before the change.
    assert [r.generation for r in revocations_due(log, 0, 4, set())] == [1]
    assert revocations_due(log, 0, 3, set()) == []
    told = GroupProgress(
        committed={0: 4}, log_start={}, modes=[RW, RW], revoked_through=revoked_through(log, set())
    )
    assert gate(log, told, 1, 0).unmet == (Wait(0, 4, 1, ChangeKind.EXPANSION),)
    acknowledged = {(0, 1)}
    assert revocations_due(log, 0, 4, acknowledged) == []
    done = GroupProgress(
        committed={0: 4},
        log_start={},
        modes=[RW, RW],
        revoked_through=revoked_through(log, acknowledged),
    )
    assert gate(log, done, 1, 0).open


def test_revoked_through_stops_at_the_first_unacknowledged_revocation() -> None:
    log = GenerationLog.start(1)
    log = log.append(log.next_generation(2, [Boundary(4), Boundary(0)]))  # 0 loses keys
    log = log.append(log.next_generation(1, [Boundary(6), Boundary(3)]))  # 1 loses keys
    log = log.append(log.next_generation(2, [Boundary(9), Boundary(3)]))  # 0 loses keys
    assert revoked_through(log, set()) == {0: 0, 1: 1}
    assert revoked_through(log, {(0, 1)}) == {0: 2, 1: 1}
    assert revoked_through(log, {(0, 1), (0, 3), (1, 2)}) == {0: 3, 1: 3}
    # Acknowledging a later one first does not skip the earlier one.
    assert revoked_through(log, {(0, 3)}) == {0: 0, 1: 1}


def test_a_compacted_log_starts_the_closure_from_its_folded_waits() -> None:
    # N=1: 1 -> 2 moves keys of 0 to the new 1 (boundary 4), 2 -> 3 moves keys of 0 to
    # the new 2 (boundary 8). Generations 0 and 1 folded: the log begins at 2 and keeps
    # what changes 1 and 2 impose as folded waits.
    full = GenerationLog.start(1)
    full = full.append(full.next_generation(2, [Boundary(4), Boundary(0)]))
    full = full.append(full.next_generation(3, [Boundary(8), Boundary(5), Boundary(0)]))
    folded = GenerationLog.after_fold(
        1,
        full[2],
        [
            FoldedWait(1, 0, 4, 1, ChangeKind.EXPANSION),
            FoldedWait(2, 0, 8, 2, ChangeKind.EXPANSION),
        ],
    )
    # Then a shrink to 1 moves the keys of 1 and 2 back into 0.
    shrink = [Boundary(9), Boundary(6), Boundary(2)]
    full = full.append(full.next_generation(1, shrink))
    folded = folded.append(folded.next_generation(1, shrink))
    assert direct_waits(folded, 1, 2) == ()  # change 1 is folded ...
    assert waits_into(folded, 1, 2) == (Wait(0, 4, 1, ChangeKind.EXPANSION),)  # ... not its wait
    assert waits_into(folded, 0, 3) == (
        Wait(0, 8, 2, ChangeKind.EXPANSION),  # inherited through 2, as in the full log
        Wait(1, 6, 3, ChangeKind.SHRINK),
        Wait(2, 2, 3, ChangeKind.SHRINK),
    )
    for partition in range(3):
        for generation in (2, 3):
            assert waits_into(folded, partition, generation) == waits_into(
                full, partition, generation
            )
    with pytest.raises(FoldedGeneration):
        waits_into(folded, 1, 1)
    with pytest.raises(FoldedGeneration):
        direct_waits(folded, 1, 1)
