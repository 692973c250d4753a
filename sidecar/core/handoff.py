"""Key hand-off between consumers (the Java ``PartitionKeyRebalanceListener``). Pure.

Two events per generation change ``k`` that moves keys from partition ``q`` to ``p``:

* **keys revoked** ``(q, k)``: the app must flush its state for ``q``'s keys before
  the group acknowledges the last record of ``q`` below ``boundary_k[q]``, i.e. before
  a commit of ``q`` reaches the boundary. Once that commit lands, the gate of ``p`` can
  open, so the flush is done before anyone else loads the keys.
* **keys assigned** ``(p, g)``: before the first record of ``p`` whose generation ``g``
  has waits (a gated record) is delivered, the app loads state for ``p``'s new keys.

Because the gate opens only after the commit that followed the revocation, revoked
``(q)`` always completes before assigned ``(p)`` starts.
"""

from __future__ import annotations

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


def is_gated(log: GenerationLog, partition: int, generation: int) -> bool:
    """True if records of ``generation`` in ``partition`` wait for other partitions."""
    return bool(waits_into(log, partition, generation))
