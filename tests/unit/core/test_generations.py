"""The generation log: numbering, boundaries, generation_of, modes and retirement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.generations import (
    Boundary,
    ChangeKind,
    FoldedGeneration,
    FoldedWait,
    Generation,
    GenerationLog,
    InvalidGenerationLog,
    PartitionMode,
    RetirementAction,
    RetirementView,
    modes_after_commit,
    partitions_in_mode,
    retirement_action,
)

RW, RO, REMOVED = PartitionMode.READ_WRITE, PartitionMode.READ_ONLY, PartitionMode.REMOVED


def bounds(*offsets: int) -> list[Boundary]:
    return [Boundary(o) for o in offsets]


def test_start_is_generation_zero_with_initial_count() -> None:
    log = GenerationLog.start(3)
    assert log.current.number == 0
    assert log.current.undeleted_count == 3
    assert log.current.boundaries == (Boundary(0),) * 3
    assert log.change_kind(0) is ChangeKind.CREATED


def test_append_expansion_then_shrink() -> None:
    log = GenerationLog.start(2)
    log = log.append(log.next_generation(4, bounds(10, 20, 0, 0)))
    log = log.append(log.next_generation(3, bounds(15, 20, 7, 9)))
    assert [g.undeleted_count for g in log.generations] == [2, 4, 3]
    assert log.change_kind(1) is ChangeKind.EXPANSION
    assert log.change_kind(2) is ChangeKind.SHRINK
    assert log.current.physical_count == 4


def test_generation_of_uses_the_newest_boundary_at_or_below_the_offset() -> None:
    log = GenerationLog.start(2)
    log = log.append(log.next_generation(3, bounds(10, 20, 0)))
    log = log.append(log.next_generation(4, bounds(10, 25, 5, 0)))
    # Partition 0 had no records in generation 1 (10..10): offset 10 is generation 2.
    assert [log.generation_of(0, o) for o in (0, 9, 10, 11)] == [0, 0, 2, 2]
    assert [log.generation_of(1, o) for o in (19, 20, 24, 25)] == [0, 1, 1, 2]
    assert [log.generation_of(2, o) for o in (0, 4, 5)] == [1, 1, 2]
    assert log.generation_of(3, 0) == 2
    with pytest.raises(ValueError, match="unknown"):
        log.generation_of(4, 0)


def test_adopted_topic_boundaries_start_at_log_start() -> None:
    log = GenerationLog.start(2, bounds(100, 50))
    assert log.generation_of(0, 100) == 0
    with pytest.raises(ValueError, match="below its first boundary"):
        log.generation_of(0, 99)


@pytest.mark.parametrize(
    ("count", "offsets", "message"),
    [
        (1, (5, 5), "below the initial count"),
        (2, (5, 5), "already 2"),
        (3, (5, 5), "boundaries"),
        (3, (4, 5, 0), "moves back"),
    ],
)
def test_invalid_generations_are_refused(
    count: int, offsets: tuple[int, ...], message: str
) -> None:
    log = GenerationLog.start(2, bounds(5, 5))
    with pytest.raises(InvalidGenerationLog, match=message):
        log.next_generation(count, bounds(*offsets))


def test_append_refuses_a_generation_with_the_wrong_number() -> None:
    log = GenerationLog.start(2)
    following = log.next_generation(3, bounds(1, 1, 0))
    with pytest.raises(InvalidGenerationLog, match="cannot follow"):
        log.append(Generation(7, following.undeleted_count, following.boundaries))


@given(
    steps=st.lists(
        st.tuples(st.integers(1, 40), st.lists(st.integers(0, 5), min_size=40, max_size=40)),
        max_size=12,
    )
)
def test_every_offset_belongs_to_exactly_the_generation_whose_range_holds_it(
    steps: list[tuple[int, list[int]]],
) -> None:
    initial = 1
    log = GenerationLog.start(initial)
    ends = [0] * 40
    for count, growth in steps:
        if count == log.current.undeleted_count:
            continue
        physical = max(count, log.current.physical_count)
        ends = [end + grow for end, grow in zip(ends, growth, strict=True)]
        log = log.append(log.next_generation(count, bounds(*ends[:physical])))
    for partition in range(log.current.physical_count):
        first = next(b for g in log.generations if (b := g.boundary(partition)) is not None)
        for offset in range(first, ends[partition] + 3):
            number = log.generation_of(partition, offset)
            start = log[number].boundary(partition)
            assert start is not None
            assert start <= offset
            later = [g.boundary(partition) for g in log.generations[number + 1 :]]
            assert all(b is not None and b > offset for b in later)
            # The span's end is where the next generation's records begin: every offset
            # before it has this generation, the end itself (if any) a later one.
            same, end = log.generation_span(partition, offset)
            assert same == number
            if end is None:
                assert later == []  # the current generation
            else:
                assert end > offset
                assert log.generation_of(partition, end - 1) == number
                assert log.generation_of(partition, end) > number


def test_an_uncompacted_log_begins_at_generation_zero() -> None:
    log = GenerationLog.start(2)
    log = log.append(log.next_generation(3, bounds(4, 4, 0)))
    assert log.first_number == 0
    assert log.folded_waits == ()
    with pytest.raises(KeyError):
        log[2]


def _folded_at_three() -> GenerationLog:
    # N=1: the topic went 1 -> 2 -> 4 -> 3 (generations 0-3), then 0-2 were folded.
    base = Generation(3, 3, tuple(bounds(9, 7, 5, 4)))
    waits = [
        FoldedWait(2, 0, 6, 2, ChangeKind.EXPANSION),
        FoldedWait(1, 0, 3, 1, ChangeKind.EXPANSION),
    ]
    return GenerationLog.after_fold(1, base, waits)


def test_a_compacted_log_keeps_absolute_numbers_and_refuses_folded_ones() -> None:
    log = _folded_at_three()
    assert log.first_number == 3
    # Sorted by (partition, source), whatever order they came in.
    assert [(w.partition, w.source) for w in log.folded_waits] == [(1, 0), (2, 0)]
    log = log.append(log.next_generation(5, bounds(12, 8, 6, 4, 0)))
    assert log.current.number == 4
    assert log[4].undeleted_count == 5
    assert log.folded_waits == _folded_at_three().folded_waits
    assert log.change_kind(4) is ChangeKind.EXPANSION
    with pytest.raises(FoldedGeneration, match="generation 2 was folded: the log begins at 3"):
        log[2]
    with pytest.raises(FoldedGeneration, match="the change into generation 3 was folded"):
        log.change_kind(3)
    with pytest.raises(FoldedGeneration):
        log.change_kind(0)
    assert log.generation_of(0, 9) == 3
    assert log.generation_of(0, 12) == 4
    with pytest.raises(ValueError, match=r"below its first boundary 9 .*folded"):
        log.generation_of(0, 8)


def test_logs_that_fold_different_waits_differ() -> None:
    log = _folded_at_three()
    other = GenerationLog.after_fold(1, log.current, log.folded_waits[:1])
    assert log != other
    assert log == GenerationLog.after_fold(1, log.current, reversed(log.folded_waits))


_TWO = Generation(2, 2, tuple(bounds(5, 5)))
"""A generation 2 of N=1 that a fold could begin at."""


def _expansion_wait(partition: int, source: int, boundary: int, generation: int) -> FoldedWait:
    return FoldedWait(partition, source, boundary, generation, ChangeKind.EXPANSION)


@pytest.mark.parametrize(
    ("base", "waits", "message"),
    [
        (Generation(3, 4, tuple(bounds(1, 1, 1))), [], "undeleted of 3"),
        (Generation(3, 0, ()), [], "undeleted of 0"),
        (Generation(0, 2, tuple(bounds(1, 1))), [], "generation 0"),
        (Generation(0, 1, tuple(bounds(1, 1))), [_expansion_wait(1, 0, 1, 1)], "generation 0"),
        (_TWO, [_expansion_wait(1, 0, 6, 1)], "fit"),  # above the source's boundary
        (_TWO, [_expansion_wait(1, 0, 0, 1)], "fit"),  # at 0: never kept
        (_TWO, [_expansion_wait(1, 0, 5, 3)], "fit"),  # a change after the first generation
        (_TWO, [_expansion_wait(2, 0, 5, 1)], "fit"),  # a partition it lacks
        (_TWO, [_expansion_wait(1, 2, 5, 1)], "fit"),  # a source it lacks
        (_TWO, [_expansion_wait(1, 0, 5, 1), _expansion_wait(1, 0, 4, 2)], "two folded waits"),
    ],
)
def test_a_folded_log_that_cannot_be_is_refused(
    base: Generation, waits: list[FoldedWait], message: str
) -> None:
    with pytest.raises(InvalidGenerationLog, match=message):
        GenerationLog.after_fold(1, base, waits)


def test_modes_after_commit() -> None:
    log = GenerationLog.start(2)
    shrink_from = (RW, RW, RW, RW)
    expanded = log.next_generation(4, bounds(0, 0, 0, 0))
    assert modes_after_commit((RW, RW), expanded) == shrink_from
    log = log.append(expanded)
    shrunk = log.next_generation(2, bounds(1, 1, 1, 1))
    modes = modes_after_commit(shrink_from, shrunk)
    assert modes == (RW, RW, RO, RO)
    assert partitions_in_mode(modes, RO) == [2, 3]
    log = log.append(shrunk)
    # Partition 3 is retired; then the topic grows to 5 and reuses 2 and 3.
    grown = log.next_generation(5, bounds(1, 1, 1, 1, 0))
    assert modes_after_commit((RW, RW, RO, REMOVED), grown) == (RW,) * 5
    # A shrink does not revive a removed partition.
    log = log.append(grown)
    assert (
        modes_after_commit((RW, RW, RW, REMOVED), log.next_generation(2, bounds(1, 1, 1, 1, 0)))[3]
        is REMOVED
    )


@pytest.mark.parametrize(
    ("view", "now", "action"),
    [
        (RetirementView(5, 5, False, None), 0.0, RetirementAction.REMOVE),
        (RetirementView(5, 5, False, None, revocations_pending=True), 0.0, RetirementAction.KEEP),
        (
            RetirementView(5, 5, False, 10.0, revocations_pending=True),
            10.0,
            RetirementAction.REMOVE,
        ),
        (RetirementView(0, 5, False, None), 0.0, RetirementAction.KEEP),
        (RetirementView(0, 5, True, None), 0.0, RetirementAction.TRUNCATE),
        # Compacted: never truncated (Kafka refuses it), removed empty or at delete_after.
        (RetirementView(0, 5, True, None, compacted=True), 0.0, RetirementAction.KEEP),
        (RetirementView(5, 5, True, None, compacted=True), 0.0, RetirementAction.REMOVE),
        (RetirementView(0, 5, True, 100.0, compacted=True), 100.0, RetirementAction.REMOVE),
        (RetirementView(0, 5, False, 100.0), 99.9, RetirementAction.KEEP),
        (RetirementView(0, 5, False, 100.0), 100.0, RetirementAction.REMOVE),
        # A transaction still open: the stable offset is not the end; neither empty nor
        # consumed to the end can be told (only the delete-after time retires it).
        (RetirementView(0, 0, False, None, transaction_open=True), 0.0, RetirementAction.KEEP),
        (RetirementView(0, 5, True, None, transaction_open=True), 0.0, RetirementAction.KEEP),
        (
            RetirementView(5, 5, True, None, transaction_open=True, compacted=True),
            0.0,
            RetirementAction.KEEP,
        ),
        (
            RetirementView(0, 0, False, 100.0, transaction_open=True),
            100.0,
            RetirementAction.REMOVE,
        ),
    ],
)
def test_retirement_action(view: RetirementView, now: float, action: RetirementAction) -> None:
    assert retirement_action(view, now) is action
