"""Key hand-off between consumers (the Java ``PartitionKeyRebalanceListener``). Pure.

Two events per generation change ``k`` that moves keys from partition ``q`` to ``p``:

* **keys revoked** ``(q, k)``: the app must flush its state for ``q``'s keys before
  the group acknowledges the last record of ``q`` below ``boundary_k[q]``, i.e. before
  a commit of ``q`` reaches the boundary. Once that commit lands, the gate of ``p`` can
  open, so the flush is done before anyone else loads the keys.
* **keys assigned** ``(p, g)``: before the first record of ``p`` whose generation ``g``
  has waits (a gated record) is delivered, the app loads state for ``p``'s new keys.

The revocation is told once the instance that consumes ``q`` has delivered it up to
the boundary, also when that happened before the change committed (a group that had
caught up: produces are held during the barrier, so this is the common case). The group
acknowledges each revocation once, whoever tells it (``acknowledged`` below, kept in
ZooKeeper), and the gate of ``p`` opens only once every revocation of ``q`` up to the
change is acknowledged (``revoked_through``): revoked ``(q)`` always completes before
assigned ``(p)`` starts, and a new owner of ``q`` tells what its predecessor had not got
acknowledged.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from enum import StrEnum

from sidecar.core.gate import waits_into
from sidecar.core.generations import GenerationLog
from sidecar.core.routing import relocations


class HandoffKind(StrEnum):
    KEYS_REVOKED = "keys_revoked"
    """Flush state for the partition's keys: they are moving away."""
    KEYS_ASSIGNED = "keys_assigned"
    """Load state for the partition's keys: they have moved in."""


class AssignmentChange(StrEnum):
    """A rebalance gave partitions to an instance or took them away (Java's
    ``ConsumerRebalanceListener``). Told only to instances that ask for it: unlike key
    hand-off, nothing waits for the app to act on it."""

    PARTITIONS_REVOKED = "partitions_revoked"
    PARTITIONS_ASSIGNED = "partitions_assigned"


@dataclass(frozen=True, slots=True)
class Revocation:
    """Keys of ``partition`` move away at ``boundary`` (generation change ``generation``)."""

    partition: int
    generation: int
    boundary: int


def revocations_crossed(
    log: GenerationLog, partition: int, committed_before: int, committing: int
) -> list[Revocation]:
    """The revocations a commit of ``partition`` from ``committed_before`` to
    ``committing`` passes: those whose boundary lies in ``(committed_before, committing]``.

    A boundary at 0 is never crossed: there was nothing to flush.
    """
    return [
        revocation
        for revocation in revocation_points(log, partition)
        if committed_before < revocation.boundary <= committing
    ]


def revocation_points(log: GenerationLog, partition: int) -> tuple[Revocation, ...]:
    """Every change that moved keys away from ``partition``, oldest first."""
    points: list[Revocation] = []
    for number in range(1, len(log.generations)):
        before, after = log[number - 1], log[number]
        sources = {
            source
            for source, _ in relocations(
                log.initial_count, before.undeleted_count, after.undeleted_count
            )
        }
        boundary = after.boundary(partition)
        if partition in sources and boundary is not None:
            points.append(Revocation(partition, number, boundary))
    return tuple(points)


def revocations_due(
    log: GenerationLog, partition: int, delivered_to: int, acknowledged: Set[tuple[int, int]]
) -> list[Revocation]:
    """Revocations the instance consuming ``partition`` must tell now, oldest first.

    Every change that moved keys away from ``partition`` at a boundary the instance has
    delivered up to (``delivered_to``: the next offset to deliver, past markers and
    skipped records) and that the group has not acknowledged yet, as ``(partition,
    generation)`` in ``acknowledged``. A boundary at 0 is left out: nothing was there.
    """
    return [
        revocation
        for revocation in revocation_points(log, partition)
        if 0 < revocation.boundary <= delivered_to
        and (partition, revocation.generation) not in acknowledged
    ]


def revoked_through(log: GenerationLog, acknowledged: Set[tuple[int, int]]) -> Mapping[int, int]:
    """Per physical partition, the newest generation up to which every revocation of its
    keys is acknowledged by the group (the current generation if all are).

    The gate holds a record that waits on ``(q, k)`` until ``revoked_through[q] >= k``.
    """
    through: dict[int, int] = {}
    for partition in range(log.current.physical_count):
        reached = log.current.number
        for revocation in revocation_points(log, partition):
            if revocation.boundary > 0 and (partition, revocation.generation) not in acknowledged:
                reached = revocation.generation - 1
                break
        through[partition] = reached
    return through


def is_gated(log: GenerationLog, partition: int, generation: int) -> bool:
    """True if records of ``generation`` in ``partition`` wait for other partitions."""
    return bool(waits_into(log, partition, generation))
