"""The generation log of a managed topic (DESIGN §4) and per-partition modes.

A *generation* is one period during which every sidecar routes the topic with the
same undeleted partition count. Generation ``g`` records, for every physical
partition, the *boundary*: the offset at which ``g`` began there (read after every
producer stopped writing with ``g - 1``). Because boundaries only grow, each record
``(partition, offset)`` belongs to exactly one generation, and everything below
``boundary_g[p]`` was routed with an older count.

KIP-253 keeps ``leaderEpochAfterCreation`` / ``leaderEpochBeforeDeletion`` maps and
converts leader epochs to offsets with OffsetsForLeaderEpoch. The sidecar stores the
offsets directly; it keeps the partition leader epoch seen with each boundary (KIP-320)
so that a boundary lost to log truncation can be detected rather than trusted.

A log may have been compacted (``sidecar.core.compaction``): its first generations,
whose records are all gone, folded into the waits their changes still impose
(``FoldedWait``). Generation numbers stay absolute (records carry theirs in a header,
ZooKeeper paths name them): a compacted log begins at ``first_number``, and asking it
about an older generation raises ``FoldedGeneration``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar, cast

_T = TypeVar("_T")


class PartitionMode(StrEnum):
    """Per-partition mode (partition-deletion proposal: ReadWrite / ReadOnly / None)."""

    READ_WRITE = "read_write"
    """Undeleted: routed to, read."""
    READ_ONLY = "read_only"
    """Marked for deletion: no new writes, still read until drained."""
    REMOVED = "removed"
    """Retired: empty or past its delete-after delay; filtered from reads and writes."""


class ChangeKind(StrEnum):
    """What a generation change did to the undeleted count."""

    CREATED = "created"
    EXPANSION = "expansion"
    SHRINK = "shrink"


class InvalidGenerationLog(ValueError):
    """A generation would break the log's invariants (count, boundaries, numbering)."""


class FoldedGeneration(KeyError):
    """A generation that compaction folded away was asked about: its records are gone,
    and the log no longer knows its count or boundaries."""

    def __str__(self) -> str:
        # KeyError's own str() is the repr of its argument, quotes included.
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True, slots=True)
class Boundary:
    """Offset at which a generation began in one partition, and the leader epoch then."""

    offset: int
    leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class Generation:
    """One committed generation: its number, undeleted count and per-partition boundaries.

    ``boundaries[p]`` exists for every physical partition ``p`` at commit time, so
    ``len(boundaries)`` is the physical partition count (read-only and removed
    partitions included).
    """

    number: int
    undeleted_count: int
    boundaries: tuple[Boundary, ...]

    @property
    def physical_count(self) -> int:
        return len(self.boundaries)

    def boundary(self, partition: int) -> int | None:
        """Boundary offset in ``partition``, or None if it did not exist yet."""
        if 0 <= partition < len(self.boundaries):
            return self.boundaries[partition].offset
        return None


@dataclass(frozen=True, slots=True)
class FoldedWait:
    """A wait that a change folded away by compaction still imposes on the records of
    ``partition`` in the log's first kept generation and later (``sidecar.core.gate``
    inherits it as it would from the change itself): the group must have consumed
    ``source`` up to ``boundary`` at change ``generation`` (of kind ``kind``)."""

    partition: int
    source: int
    boundary: int
    generation: int
    kind: ChangeKind


@dataclass(frozen=True, slots=True)
class GenerationLog:
    """The committed generations of one topic, oldest first, numbered consecutively from
    ``first_number`` (0 unless the log was compacted)."""

    initial_count: int
    generations: tuple[Generation, ...]
    folded_waits: tuple[FoldedWait, ...] = ()
    """The waits the folded changes leave, one per (partition, source), sorted; empty
    unless the log was compacted (see ``sidecar.core.compaction``)."""
    _by_partition: dict[int, tuple[list[int], list[int]]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    """Per partition, the generations that have a boundary in it and those boundaries,
    built on first use: the consume path asks the generation of every record, and a
    long-lived topic has hundreds of generations. A memo; the log itself never changes."""
    _derived: dict[Hashable, object] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    """Facts other pure functions derive from the log, by key (see ``derived``)."""

    @classmethod
    def start(
        cls, initial_count: int, boundaries: Sequence[Boundary] | None = None
    ) -> GenerationLog:
        """Generation 0 of a created or adopted topic: ``U == N``.

        ``boundaries`` defaults to offset 0 everywhere: records already in an
        adopted topic were routed by Kafka's default partitioner, which is linear
        hashing with ``U == N``, so they belong to generation 0 too.
        Raises InvalidGenerationLog if ``initial_count < 1``.
        """
        if initial_count < 1:
            raise InvalidGenerationLog(f"initial count must be at least 1, got {initial_count}")
        if boundaries is None:
            boundaries = [Boundary(0)] * initial_count
        if len(boundaries) < initial_count:
            raise InvalidGenerationLog(
                f"{len(boundaries)} boundaries for {initial_count} initial partitions"
            )
        first = Generation(0, initial_count, tuple(boundaries))
        return cls(initial_count, (first,))

    @classmethod
    def after_fold(
        cls, initial_count: int, base: Generation, folded_waits: Iterable[FoldedWait]
    ) -> GenerationLog:
        """The log of a topic whose generations before ``base`` were folded: ``base``
        is its first generation, ``folded_waits`` what the folded changes still impose.

        Raises InvalidGenerationLog if ``base`` is not a generation the topic could have
        (count below N or above its physical partitions; generation 0 with another count
        than N) or a wait does not fit it (a partition it lacks, a change after it, a
        boundary above the source's in ``base``, two waits for one partition and source).
        """
        if base.number < 0:
            raise InvalidGenerationLog(f"generation {base.number} is negative")
        if not 1 <= initial_count <= base.undeleted_count <= base.physical_count:
            raise InvalidGenerationLog(
                f"generation {base.number} has {base.undeleted_count} undeleted of "
                f"{base.physical_count} partitions, and the initial count is {initial_count}"
            )
        ordered = tuple(sorted(folded_waits, key=lambda w: (w.partition, w.source)))
        if base.number == 0 and (base.undeleted_count != initial_count or ordered):
            raise InvalidGenerationLog("generation 0 has the initial count and folds nothing")
        for index, wait in enumerate(ordered):
            source_boundary = base.boundary(wait.source)
            if (
                not 0 <= wait.partition < base.physical_count
                or source_boundary is None
                or not 1 <= wait.generation <= base.number
                or not 0 < wait.boundary <= source_boundary
            ):
                raise InvalidGenerationLog(f"{wait} does not fit generation {base.number}")
            if index and (ordered[index - 1].partition, ordered[index - 1].source) == (
                wait.partition,
                wait.source,
            ):
                raise InvalidGenerationLog(f"two folded waits of {wait.partition} on {wait.source}")
        return cls(initial_count, (base,), ordered)

    @property
    def first_number(self) -> int:
        """The number of the oldest generation the log keeps; those before were folded."""
        return self.generations[0].number

    @property
    def current(self) -> Generation:
        return self.generations[-1]

    def __getitem__(self, number: int) -> Generation:
        """Generation ``number``. Raises FoldedGeneration if it was folded, KeyError if
        it is not committed yet."""
        index = number - self.first_number
        if index < 0:
            raise FoldedGeneration(
                f"generation {number} was folded: the log begins at {self.first_number}"
            )
        if index >= len(self.generations):
            raise KeyError(number)
        return self.generations[index]

    def next_generation(self, undeleted_count: int, boundaries: Sequence[Boundary]) -> Generation:
        """Validate and build the generation that would follow the current one.

        Raises InvalidGenerationLog if the count is below N, unchanged, above the
        physical partition count, or if any boundary moves backwards or is missing.
        """
        previous = self.current
        if undeleted_count < self.initial_count:
            raise InvalidGenerationLog(
                f"undeleted count {undeleted_count} is below the initial count {self.initial_count}"
            )
        if undeleted_count == previous.undeleted_count:
            raise InvalidGenerationLog(f"undeleted count is already {undeleted_count}")
        if len(boundaries) < max(undeleted_count, previous.physical_count):
            raise InvalidGenerationLog(
                f"{len(boundaries)} boundaries, but the topic has "
                f"{max(undeleted_count, previous.physical_count)} partitions"
            )
        for partition, old in enumerate(previous.boundaries):
            if boundaries[partition].offset < old.offset:
                raise InvalidGenerationLog(
                    f"boundary of partition {partition} moves back from {old.offset} "
                    f"to {boundaries[partition].offset}"
                )
        return Generation(previous.number + 1, undeleted_count, tuple(boundaries))

    def append(self, generation: Generation) -> GenerationLog:
        """The log with ``generation`` committed after the current one.

        Raises InvalidGenerationLog unless ``generation`` is what ``next_generation``
        would build from the same count and boundaries.
        """
        expected = self.next_generation(generation.undeleted_count, generation.boundaries)
        if generation.number != expected.number:
            raise InvalidGenerationLog(
                f"generation {generation.number} cannot follow {self.current.number}"
            )
        return GenerationLog(self.initial_count, (*self.generations, generation), self.folded_waits)

    def change_kind(self, number: int) -> ChangeKind:
        """Whether generation ``number`` began with an expansion or a shrink.

        Raises FoldedGeneration if that change was folded (so is the change into the
        first generation of a compacted log), KeyError if it is not committed yet.
        """
        after = self[number]
        if number == 0:
            return ChangeKind.CREATED
        if number == self.first_number:
            raise FoldedGeneration(f"the change into generation {number} was folded")
        before = self[number - 1]
        if after.undeleted_count > before.undeleted_count:
            return ChangeKind.EXPANSION
        return ChangeKind.SHRINK

    def generation_of(self, partition: int, offset: int) -> int:
        """The generation whose producers wrote ``(partition, offset)``.

        It is the newest generation whose boundary in ``partition`` is at or
        below ``offset``. Raises ValueError if ``partition`` does not exist in any
        generation, or ``offset`` is below the partition's first boundary.
        """
        return self.generation_span(partition, offset)[0]

    def generation_span(self, partition: int, offset: int) -> tuple[int, int | None]:
        """``generation_of(partition, offset)``, and the offset at which the next
        generation's records begin in ``partition`` (None: none has yet). Every record
        from ``offset`` up to it belongs to the same generation, so a reader decides
        once for the run. Raises ValueError as ``generation_of`` does."""
        numbers, offsets = self._boundaries_in(partition)
        index = bisect.bisect_right(offsets, offset) - 1
        if index < 0:
            folded = self.first_number > 0
            raise ValueError(
                f"offset {offset} of partition {partition} is below its first boundary "
                f"{offsets[0]}" + (" (the generations before it were folded)" if folded else "")
            )
        end = offsets[index + 1] if index + 1 < len(offsets) else None
        return numbers[index], end

    def derived(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, once per log and ``key``: for pure functions of the log (and
        of the key) that the consume path asks on every poll, such as a partition's
        revocation points or a record's waits."""
        if key not in self._derived:
            self._derived[key] = compute()
        return cast(_T, self._derived[key])

    def _boundaries_in(self, partition: int) -> tuple[list[int], list[int]]:
        cached = self._by_partition.get(partition)
        if cached is not None:
            return cached
        numbers: list[int] = []
        offsets: list[int] = []
        for generation in self.generations:
            boundary = generation.boundary(partition)
            if boundary is not None:
                numbers.append(generation.number)
                offsets.append(boundary)
        if not numbers:
            raise ValueError(f"partition {partition} is unknown to the generation log")
        self._by_partition[partition] = (numbers, offsets)
        return numbers, offsets


def modes_after_commit(
    previous: Sequence[PartitionMode], generation: Generation
) -> tuple[PartitionMode, ...]:
    """Partition modes once ``generation`` is committed.

    Partitions below the new undeleted count are read-write (including ones brought
    back from an earlier life). Partitions at or above it that were read-write become
    read-only (marked for deletion); read-only and removed ones keep their mode.
    """
    modes: list[PartitionMode] = []
    for partition in range(generation.physical_count):
        old = previous[partition] if partition < len(previous) else PartitionMode.REMOVED
        if partition < generation.undeleted_count:
            modes.append(PartitionMode.READ_WRITE)
        elif old is PartitionMode.READ_WRITE:
            modes.append(PartitionMode.READ_ONLY)
        else:
            modes.append(old)
    return tuple(modes)


@dataclass(frozen=True, slots=True)
class RetirementView:
    """What is known of one read-only partition when deciding whether to retire it."""

    log_start: int
    log_end: int
    groups_consumed_to_end: bool
    """Every consumer group known to the sidecars has committed at least ``log_end``."""
    delete_after: float | None
    """Wall-clock time (seconds) after which the partition is removed regardless."""
    revocations_pending: bool = False
    """Some known group read the partition and has not acknowledged every keys_revoked
    of it: even empty (truncated earlier, brought back, nothing written since) it stays
    assigned, so its owner can still tell them."""
    transaction_open: bool = False
    """A transaction is still open in the partition (its last stable offset, ``log_end``,
    is below its high watermark): records past ``log_end`` may still be committed, so
    neither "empty" nor "consumed to its end" can be told until it ends."""
    compacted: bool = False
    """The topic is compacted (``cleanup.policy=compact``): Kafka refuses DeleteRecords,
    and a key not written since the shrink has its newest value only here, so a drained
    partition is kept (until ``delete_after``), not truncated."""


class RetirementAction(StrEnum):
    KEEP = "keep"
    """Still holds data some group has not consumed."""
    TRUNCATE = "truncate"
    """Drained by every known group: DeleteRecords up to the log end, then remove (never
    for a compacted topic)."""
    REMOVE = "remove"
    """Empty, or past its delete-after time: mark removed."""


def retirement_action(view: RetirementView, now: float) -> RetirementAction:
    """Decide what to do with a read-only partition (DESIGN §5 "Retirement")."""
    if view.delete_after is not None and now >= view.delete_after:
        return RetirementAction.REMOVE
    if view.transaction_open:
        return RetirementAction.KEEP
    if view.log_start >= view.log_end and not view.revocations_pending:
        return RetirementAction.REMOVE
    if view.groups_consumed_to_end and not view.compacted:
        return RetirementAction.TRUNCATE
    return RetirementAction.KEEP


def assignable_partitions(modes: Sequence[PartitionMode]) -> frozenset[int]:
    """The partitions a consumer group is assigned: every one not removed."""
    return frozenset(p for p, mode in enumerate(modes) if mode is not PartitionMode.REMOVED)


def partitions_in_mode(modes: Sequence[PartitionMode], mode: PartitionMode) -> list[int]:
    """Indexes of the partitions in ``mode``."""
    return [p for p, current in enumerate(modes) if current is mode]
