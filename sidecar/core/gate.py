"""The consumer gate (DESIGN §6, KIP-253 §6 steps 4-5) as a pure predicate.

Rule: record ``(p, offset)`` of generation ``g`` may be delivered only when, for
every generation change ``k <= g`` that moved keys into ``p`` from a partition ``q``,
the group has consumed ``q`` up to ``boundary_k[q]`` *and* everything a record of
``q`` in generation ``k - 1`` would itself have had to wait for (recursively).

The recursion matters. Take N=1: a key lives in partition 3 (U=4), a shrink to U=1
moves it to partition 0, an expansion to U=2 moves it to partition 1. If nothing of
that key was written while U=1, partition 0 holds no record that waited on partition
3, so "partition 0 consumed to its boundary" says nothing about partition 3: the
wait has to be inherited explicitly. The result keeps one wait per source (the
highest boundary), since consuming further implies consuming less far.

"Consumed up to ``b``" means: the group's committed offset for ``q`` is at least
``b`` (a real Kafka group offset, so it survives restarts), or ``q``'s log start
is at least ``b`` (the data below the boundary no longer exists), or ``q`` is removed.
A committed offset also needs the key hand-off done: the group has acknowledged every
``keys_revoked`` of ``q`` up to change ``k`` (``GroupProgress.revoked_through``, see
``sidecar.core.handoff``), so the app flushed ``q``'s state before ``p`` loads it.

Why no wait can be part of a cycle: a record of generation ``g`` waits only for
records below ``boundary_k[q]`` with ``k <= g``, and those all belong to generations
strictly older than ``k``. Generations are well-ordered, so every chain of waits
ends. This is what allows an expansion while a shrink is still draining.

A compacted log (``sidecar.core.compaction``) no longer has its oldest changes. What
they imposed on records of its first generation and later is kept as the log's folded
waits, and the closure starts from those where it would have gone on into the folded
changes: a record's waits are the same as in the log before compaction.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

from sidecar.core.generations import ChangeKind, FoldedGeneration, GenerationLog, PartitionMode
from sidecar.core.routing import expansion_blocker, shrink_blockers


@dataclass(frozen=True, slots=True)
class Wait:
    """The group must consume ``source`` up to ``boundary`` (generation change ``generation``)."""

    source: int
    boundary: int
    generation: int
    kind: ChangeKind


class WaitKey(NamedTuple):
    """A wait one consumer instance announces: its group needs ``source`` of ``topic``
    consumed up to ``boundary``."""

    topic: str
    source: int
    boundary: int


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """What the gate knows of one consumer group and the topic's partitions.

    ``committed``: the group's committed offset per partition (next offset to read);
    a partition without one has consumed nothing. ``log_start``: each partition's
    log start offset. ``modes``: each physical partition's mode.
    """

    committed: Mapping[int, int]
    log_start: Mapping[int, int]
    modes: Sequence[PartitionMode]
    revoked_through: Mapping[int, int] | None = None
    """Per partition, the newest change up to which the group acknowledged every
    ``keys_revoked`` of it; None: no hand-off is tracked (every one counts as done)."""

    def consumed_up_to(self, partition: int, boundary: int) -> bool:
        """True if the group has nothing left to read below ``boundary`` in ``partition``."""
        if partition < len(self.modes) and self.modes[partition] is PartitionMode.REMOVED:
            return True
        position = max(self.committed.get(partition, 0), self.log_start.get(partition, 0))
        return position >= boundary

    def met(self, wait: Wait) -> bool:
        """True if the group consumed the wait's source up to its boundary and, where
        it read those records itself, acknowledged that their keys moved away."""
        source = wait.source
        if source < len(self.modes) and self.modes[source] is PartitionMode.REMOVED:
            return True
        committed = self.committed.get(source)
        if committed is None and self.log_start.get(source, 0) >= wait.boundary:
            return True  # the records are gone and the group never read any of them
        # A group that read some of them (retention may have removed them since) holds
        # state for their keys: it must be told they moved before they are read elsewhere.
        if max(committed or 0, self.log_start.get(source, 0)) < wait.boundary:
            return False
        through = self.revoked_through
        return through is None or through.get(source, -1) >= wait.generation


@dataclass(frozen=True, slots=True)
class GateDecision:
    """Whether a record may be delivered, and the waits still unmet if not."""

    generation: int
    unmet: tuple[Wait, ...]

    @property
    def open(self) -> bool:
        return not self.unmet


def direct_waits(log: GenerationLog, partition: int, generation: int) -> tuple[Wait, ...]:
    """The waits of changes ``1..generation`` that moved keys straight into ``partition``
    (of a compacted log: the changes it keeps, after its first generation).

    Expansion ``k`` that created ``partition``: one wait, on its blocker. Shrink
    ``k`` that kept ``partition``: one wait per retired partition whose keys moved
    into it (O(log n) for moderate shrinks). Oldest change first. Raises
    FoldedGeneration if ``generation`` was folded.
    """
    _require_kept(log, generation)
    numbers, changes = _direct_wait_table(log).get(partition, ((), ()))
    return tuple(w for waits in changes[: bisect.bisect_right(numbers, generation)] for w in waits)


def waits_into(log: GenerationLog, partition: int, generation: int) -> tuple[Wait, ...]:
    """Every wait a record of ``generation`` in ``partition`` is subject to.

    The transitive closure of ``direct_waits`` (see the module comment), one wait per
    source partition, sorted by source. Waits on offset 0 are dropped: always met.
    Raises FoldedGeneration if ``generation`` was folded (no record of it is left).
    """
    _require_kept(log, generation)

    def compute() -> tuple[Wait, ...]:
        strongest = _strongest_waits(log, partition, generation)
        return tuple(strongest[s] for s in sorted(strongest) if strongest[s].boundary > 0)

    return log.derived(("waits_into", partition, generation), compute)


def _require_kept(log: GenerationLog, generation: int) -> None:
    # Below its first generation a compacted log would answer with what the folded
    # changes left for the first one: more waits than the older records had.
    if generation < log.first_number:
        raise FoldedGeneration(
            f"generation {generation} was folded: the log begins at {log.first_number}"
        )


_DirectWaitTable = dict[int, tuple[list[int], list[tuple[Wait, ...]]]]
"""Per partition, the changes that moved keys straight into it (ascending numbers) and
each one's direct waits."""


def _direct_wait_table(log: GenerationLog) -> _DirectWaitTable:
    """Built once per log, in one pass over its changes: asked per generation, the
    direct waits were a pass over every older change each time, and the closure asks
    them for many nodes (seconds per change on a log of a few hundred generations)."""

    def build() -> _DirectWaitTable:
        table: _DirectWaitTable = {}
        # The changes the log keeps: those into its generations after the first.
        for before, after in pairwise(log.generations):
            number = after.number
            old_count, new_count = before.undeleted_count, after.undeleted_count
            moves: dict[int, list[int]]
            if new_count > old_count:
                moves = {
                    partition: [expansion_blocker(partition, log.initial_count, old_count)]
                    for partition in range(old_count, new_count)
                }
                kind = ChangeKind.EXPANSION
            else:
                moves = {
                    partition: shrink_blockers(partition, log.initial_count, old_count, new_count)
                    for partition in range(new_count)
                }
                kind = ChangeKind.SHRINK
            for partition, sources in moves.items():
                waits = []
                for source in sources:
                    boundary = after.boundary(source)
                    # A source partition existed under the old count, so it has a boundary.
                    assert boundary is not None
                    waits.append(Wait(source, boundary, number, kind))
                if waits:
                    numbers, changes = table.setdefault(partition, ([], []))
                    numbers.append(number)
                    changes.append(tuple(waits))
        return table

    return log.derived(("direct_wait_table",), build)


def _strongest_waits(log: GenerationLog, partition: int, generation: int) -> Mapping[int, Wait]:
    """Per source, the strongest wait reachable from ``(partition, generation)`` through
    ``direct_waits`` (boundary-0 waits kept): the closure ``waits_into`` reduces.

    Evaluated per (partition, change into it), newest first, reusing each result for the
    log: what ``(p, g)`` reaches is what ``p`` reached at its previous change into it,
    plus each wait of the change at or below ``g`` and what its source reached in the
    generation before that change. Each step goes to an older generation, so it ends
    (the module comment); an explicit stack, since chains are as long as the log. Where
    no kept change is left, what is reached is what the folded ones left: the log's
    folded waits (nothing for a log that was never compacted).
    """
    table = _direct_wait_table(log)
    folded = _folded_waits(log)
    memo: dict[tuple[int, int], dict[int, Wait]] = log.derived(("strongest_waits",), dict)

    def node(p: int, g: int) -> tuple[int, int] | None:
        numbers = table[p][0] if p in table else []
        index = bisect.bisect_right(numbers, g) - 1
        return None if index < 0 else (p, index)

    root = node(partition, generation)
    if root is None:
        return folded.get(partition, {})
    stack = [root]
    while stack:
        current = stack[-1]
        if current in memo:
            stack.pop()
            continue
        p, index = current
        waits = table[p][1][index]
        previous = (p, index - 1) if index > 0 else None
        inherited = [node(w.source, w.generation - 1) for w in waits]
        needed = [n for n in (previous, *inherited) if n is not None and n not in memo]
        if needed:
            stack.extend(needed)
            continue
        strongest = dict(memo[previous] if previous is not None else folded.get(p, {}))
        for wait, source_node in zip(waits, inherited, strict=True):
            _keep_stronger(strongest, wait)
            source_reached = (
                memo[source_node] if source_node is not None else folded.get(wait.source, {})
            )
            for reached in source_reached.values():
                _keep_stronger(strongest, reached)
        memo[current] = strongest
        stack.pop()
    return memo[root]


def _folded_waits(log: GenerationLog) -> Mapping[int, Mapping[int, Wait]]:
    """Per partition and source, the waits a compacted log's folded changes left on the
    partition's records (``GenerationLog.folded_waits``), as the closure uses them."""

    def build() -> dict[int, dict[int, Wait]]:
        by_partition: dict[int, dict[int, Wait]] = {}
        for folded in log.folded_waits:
            wait = Wait(folded.source, folded.boundary, folded.generation, folded.kind)
            by_partition.setdefault(folded.partition, {})[folded.source] = wait
        return by_partition

    return log.derived(("folded_waits",), build)


def _keep_stronger(strongest: dict[int, Wait], wait: Wait) -> None:
    # Of two waits on one source at the same boundary (nothing was written to it between
    # the two changes), the newer: the gate holds until every keys_revoked of the source
    # up to that change is acknowledged, not only the older one's.
    held = strongest.get(wait.source)
    if held is None or (wait.boundary, wait.generation) > (held.boundary, held.generation):
        strongest[wait.source] = wait


def gate(log: GenerationLog, progress: GroupProgress, partition: int, offset: int) -> GateDecision:
    """Decide whether the group may deliver record ``(partition, offset)``.

    Raises ValueError if the log does not know ``partition`` or ``offset``'s generation
    (see ``GenerationLog.generation_of``).
    """
    generation = log.generation_of(partition, offset)
    return GateDecision(generation, unmet(waits_into(log, partition, generation), progress))


def unmet(waits: Sequence[Wait], progress: GroupProgress) -> tuple[Wait, ...]:
    """The waits the group has not consumed far enough for yet.

    Split from ``gate`` so that a caller deciding many records of one (partition,
    generation) computes ``waits_into`` once.
    """
    return tuple(w for w in waits if not progress.met(w))
