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

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import pairwise
from typing import ClassVar, NamedTuple

from sidecar.core.consume import TopicPartition
from sidecar.core.errors import BadRequest
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


class TruncationKind(StrEnum):
    """A partition's log was cut below what an instance had read (KIP-320)."""

    LOG_TRUNCATED = "log_truncated"


class Subject(NamedTuple):
    """What one hand-off event is about: keys of ``partition`` of ``topic`` at generation
    change ``generation``."""

    topic: str
    partition: int
    generation: int


@dataclass(frozen=True, slots=True)
class AssignmentNotice:
    """Partitions a rebalance gave to an instance or took from it."""

    kind: AssignmentChange
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class TruncationNotice:
    """The log of a partition was cut below what the instance had read (an unclean
    leader election, KIP-320): the offsets it read from ``resume_at`` up to ``position``
    (``lost`` of them) are no longer in the log, and it reads again from ``resume_at``
    (None: not known, and it reads again from the log's start). Kafka's Java consumer
    raises LogTruncationException; nothing waits for the app here."""

    tp: TopicPartition
    position: int
    leader_epoch: int
    resume_at: int | None
    lost: int

    @property
    def kind(self) -> TruncationKind:
        return TruncationKind.LOG_TRUNCATED


Notice = AssignmentNotice | TruncationNotice
"""What an instance tells its app without waiting for an acknowledgement."""


@dataclass(frozen=True, slots=True)
class HandoffCallback:
    """A key hand-off told to the app's callback URL (encoded by the HTTP layer)."""

    kind: HandoffKind
    group: str
    instance_id: str
    subject: Subject


@dataclass(frozen=True, slots=True)
class AssignmentCallback:
    """A rebalance, or a truncation, told to the app's callback URL (encoded by the HTTP
    layer)."""

    group: str
    instance_id: str
    notice: Notice


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
    """Every change that moved keys away from ``partition``, oldest first.

    A compacted log has none of its folded changes (``sidecar.core.compaction`` folds
    one only once no group is owed its revocations: their boundaries lie at or below
    the log start, and no known group that read the partition still waits to be told).
    """
    return log.derived(("revocation_points", partition), lambda: _revocation_points(log, partition))


def _revocation_points(log: GenerationLog, partition: int) -> tuple[Revocation, ...]:
    points: list[Revocation] = []
    for generation, sources in zip(log.generations, _relocation_sources(log), strict=True):
        boundary = generation.boundary(partition)
        if partition in sources and boundary is not None:
            points.append(Revocation(partition, generation.number, boundary))
    return tuple(points)


def _relocation_sources(log: GenerationLog) -> tuple[frozenset[int], ...]:
    """Per generation the log keeps, the partitions whose keys its change moved away
    (none for its first generation: generation 0, or the change into it was folded):
    once per log, shared by every partition's revocation points."""

    def compute() -> tuple[frozenset[int], ...]:
        sources = [frozenset[int]()]
        for before, after in pairwise(log.generations):
            moved = relocations(log.initial_count, before.undeleted_count, after.undeleted_count)
            sources.append(frozenset(source for source, _ in moved))
        return tuple(sources)

    return log.derived(("relocation_sources",), compute)


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


# The ledger of one consumer instance ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class HandoffEvent:
    """A key hand-off the app is told of; it acknowledges it by ``event_id``."""

    event_id: int
    kind: HandoffKind
    topic: str
    partition: int
    generation: int

    @property
    def subject(self) -> Subject:
        return Subject(self.topic, self.partition, self.generation)


@dataclass(frozen=True, slots=True)
class HandoffLedger:
    """What one consumer instance told its app of key hand-off, and what was acknowledged.

    Pure: the instance keeps the current ledger and replaces it with what each method
    returns. The rules:

    * an event is told until acknowledged, under one id (telling it again returns the
      same event);
    * ``keys_revoked`` is told once per group: acknowledged by this instance's app or
      recorded for the group by another instance (``with_group_revocations``), it is not
      told here again, and a pending one is dropped;
    * when a rebalance takes a partition away, its pending ``keys_revoked`` events are
      retired: no longer told, still accepted as acknowledged (the app may have got one
      before the rebalance), the newest ``RETIRED_KEPT`` of them;
    * acknowledging an id that is neither pending nor retired is refused
      (BadRequest), and then nothing of that acknowledgement is taken.
    """

    RETIRED_KEPT: ClassVar[int] = 1000

    next_id: int = 1
    pending: Mapping[int, HandoffEvent] = field(default_factory=dict)
    retired: Mapping[int, HandoffEvent] = field(default_factory=dict)
    assigned: frozenset[tuple[str, int, int]] = frozenset()
    """(topic, partition, generation) whose keys_assigned the app acknowledged."""
    revoked: Mapping[str, frozenset[tuple[int, int]]] = field(default_factory=dict)
    """Per topic, the (partition, generation) revocations acknowledged for the group."""

    def tell(
        self, kind: HandoffKind, topic: str, partition: int, generation: int
    ) -> tuple[HandoffLedger, HandoffEvent | None]:
        """The event to tell for this hand-off: the pending one, or a new one; None if
        it was acknowledged already."""
        if self.acknowledged(kind, topic, partition, generation):
            return self, None
        subject = (topic, partition, generation)
        for event in self.pending.values():
            if event.kind is kind and event.subject == subject:
                return self, event
        event = HandoffEvent(self.next_id, kind, topic, partition, generation)
        pending = {**self.pending, event.event_id: event}
        return replace(self, next_id=self.next_id + 1, pending=pending), event

    def acknowledged(self, kind: HandoffKind, topic: str, partition: int, generation: int) -> bool:
        if kind is HandoffKind.KEYS_REVOKED:
            return (partition, generation) in self.revoked.get(topic, frozenset())
        return (topic, partition, generation) in self.assigned

    def confirmed(
        self, kind: HandoffKind, topic: str, partition: int, generation: int
    ) -> HandoffLedger:
        """The app confirmed a hand-off without an event (its callback answered 2xx)."""
        if kind is HandoffKind.KEYS_REVOKED:
            return self.with_group_revocations(topic, {(partition, generation)})
        return replace(self, assigned=self.assigned | {(topic, partition, generation)})

    def revocations(self, topic: str) -> frozenset[tuple[int, int]]:
        """The (partition, generation) revocations of ``topic`` acknowledged for the group."""
        return self.revoked.get(topic, frozenset())

    def acknowledge(self, event_ids: Sequence[int]) -> tuple[HandoffLedger, list[HandoffEvent]]:
        """Take the app's acknowledgement; returns the acknowledged events (the
        keys_revoked among them are to be recorded for the group). Raises BadRequest for
        an id that is neither pending nor retired."""
        unknown = [i for i in event_ids if i not in self.pending and i not in self.retired]
        if unknown:
            raise BadRequest(f"no pending event {unknown[0]}")
        events = [self.pending.get(i) or self.retired[i] for i in event_ids]
        ledger = replace(
            self,
            pending={i: e for i, e in self.pending.items() if i not in event_ids},
            retired={i: e for i, e in self.retired.items() if i not in event_ids},
        )
        for event in events:
            if event.kind is HandoffKind.KEYS_REVOKED:
                ledger = ledger.with_group_revocations(
                    event.topic, {(event.partition, event.generation)}
                )
            else:
                ledger = replace(ledger, assigned=ledger.assigned | {event.subject})
        return ledger, events

    def with_group_revocations(
        self, topic: str, acknowledged: Set[tuple[int, int]]
    ) -> HandoffLedger:
        """Add revocations the group acknowledged; pending keys_revoked among them are
        dropped (told once per group)."""
        known = self.revoked.get(topic, frozenset())
        if acknowledged <= known:
            return self
        merged = known | acknowledged
        pending = {
            i: e
            for i, e in self.pending.items()
            if not (
                e.kind is HandoffKind.KEYS_REVOKED
                and e.topic == topic
                and (e.partition, e.generation) in merged
            )
        }
        return replace(self, revoked={**self.revoked, topic: frozenset(merged)}, pending=pending)

    def partitions_lost(self, partitions: Set[tuple[str, int]]) -> HandoffLedger:
        """A rebalance took ``partitions`` (topic, partition) away: retire their pending
        keys_revoked events."""
        retiring = {
            i: e
            for i, e in self.pending.items()
            if e.kind is HandoffKind.KEYS_REVOKED and (e.topic, e.partition) in partitions
        }
        if not retiring:
            return self
        retired = {**self.retired, **retiring}
        if len(retired) > self.RETIRED_KEPT:
            retired = dict(sorted(retired.items())[-self.RETIRED_KEPT :])
        pending = {i: e for i, e in self.pending.items() if i not in retiring}
        return replace(self, pending=pending, retired=retired)
