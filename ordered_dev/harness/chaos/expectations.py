"""What the hand-off contract (DESIGN §6) requires of a group, from a topic's generation
log alone. Pure.

For every committed change ``k`` and every source partition ``q`` whose keys move
(``sidecar.core.handoff.revocation_points``), each group must be told
``keys_revoked(q, k)`` exactly once, before the first gated record of any destination
that waits on ``q`` for that change. A destination is a (partition, generation) pair
whose records the gate holds: ``sidecar.core.gate.waits_into`` is not empty for it.

``waits_into`` keeps one wait per source (the highest boundary), which is what the gate
needs but not which *change* a wait comes from. ``change_sources`` keeps them all: the
closure of ``sidecar.core.gate.direct_waits`` over the same recursion as ``waits_into``
(a record waits, through every partition its key passed on the way, for the sources'
boundaries). So "(p, g) waits on q for change k" is ``(q, k) in change_sources(log, p,
g)``; the sources it names are exactly those ``waits_into`` names.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.gate import direct_waits, waits_into
from sidecar.core.generations import GenerationLog
from sidecar.core.handoff import revocation_points

Destination = tuple[int, int]
"""(partition, generation) of gated records."""


@dataclass(frozen=True, slots=True)
class RevocationDue:
    """``keys_revoked(partition, change)`` is due: keys of ``partition`` moved away at
    ``boundary`` in ``change``; ``destinations`` are the gated records that wait for it."""

    partition: int
    change: int
    boundary: int
    destinations: frozenset[Destination]


class LogWaits:
    """The waits of one generation log, each computed once."""

    def __init__(self, log: GenerationLog) -> None:
        self.log = log
        self._direct: dict[Destination, tuple[tuple[int, int, int], ...]] = {}
        self._closure: dict[Destination, frozenset[tuple[int, int]]] = {}

    def direct(self, partition: int, generation: int) -> tuple[tuple[int, int, int], ...]:
        """(source, change, boundary) of ``direct_waits``."""
        node = (partition, generation)
        if node not in self._direct:
            self._direct[node] = tuple(
                (w.source, w.generation, w.boundary)
                for w in direct_waits(self.log, partition, generation)
            )
        return self._direct[node]

    def change_sources(self, partition: int, generation: int) -> frozenset[tuple[int, int]]:
        """Every (source, change) whose keys reach ``partition`` in ``generation``, with a
        boundary above 0 (a wait at offset 0 is always met).

        Each node's set is made once from its direct waits and its sources' sets (the
        sources are older, so this is a walk of a DAG), in post-order without recursion:
        a log of 1,400 changes asked this of every node, and a search from each node
        again took about ten minutes after chaos run 15."""
        node = (partition, generation)
        if node in self._closure:
            return self._closure[node]
        stack: list[tuple[Destination, bool]] = [(node, False)]
        while stack:
            current, sources_done = stack.pop()
            if current in self._closure:
                continue
            direct = self.direct(*current)
            if not sources_done:
                stack.append((current, True))
                stack.extend(
                    ((source, change - 1), False)
                    for source, change, _ in direct
                    if (source, change - 1) not in self._closure
                )
                continue
            found: set[tuple[int, int]] = set()
            for source, change, boundary in direct:
                if boundary > 0:
                    found.add((source, change))
                found |= self._closure[(source, change - 1)]
            self._closure[current] = frozenset(found)
        return self._closure[node]

    def boundary(self, partition: int, change: int) -> int:
        boundary = self.log[change].boundary(partition)
        assert boundary is not None, f"partition {partition} has no boundary in {change}"
        return boundary

    def is_gated(self, partition: int, generation: int) -> bool:
        return bool(self.change_sources(partition, generation))

    def gated_destinations(self) -> list[Destination]:
        """Every (partition, generation) whose records the gate holds, in log order."""
        return [
            (partition, generation.number)
            for generation in self.log.generations
            for partition in range(generation.physical_count)
            if self.is_gated(partition, generation.number)
        ]

    def revocations_due(self) -> list[RevocationDue]:
        """Every ``keys_revoked`` the log requires of each group, oldest change first."""
        # Which gated destinations each (source, change) reaches, in one pass over them
        # (asking every destination again for every revocation point was most of the
        # checks' time after a run of 1,400 changes).
        reached_by: dict[tuple[int, int], set[Destination]] = {}
        for node in self.gated_destinations():
            for source_change in self.change_sources(*node):
                reached_by.setdefault(source_change, set()).add(node)
        due = []
        for partition in range(self.log.current.physical_count):
            for point in revocation_points(self.log, partition):
                if point.boundary <= 0:
                    continue  # nothing was ever below it: nothing to flush
                destinations = frozenset(reached_by.get((partition, point.generation), ()))
                due.append(RevocationDue(partition, point.generation, point.boundary, destinations))
        return sorted(due, key=lambda d: (d.change, d.partition))

    def agrees_with_waits_into(self, partition: int, generation: int) -> bool:
        """The sources ``change_sources`` names are those of ``waits_into``."""
        mine = {source for source, _ in self.change_sources(partition, generation)}
        return mine == {w.source for w in waits_into(self.log, partition, generation)}
