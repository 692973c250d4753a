"""What a chaos run observed, in the order the harness observed it.

Every observation that the checks compare in time (a delivery, a hand-off callback
answered, a hand-off event received) gets ``order``, one counter for the whole
run: the harness is one event loop, so ``order`` is the order in which things
reached the app. Times (``at``) are seconds since the run began, for the report.

A hand-off counts as received when the app has it: a callback it answered with a 2xx,
or an event in a poll response (once per event id and instance, whether or not the
answer to its acknowledgement arrives: the sidecar may have recorded it all the same).
A callback refused with 503 during a fault does not count (the sidecar must call again).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from sidecar.core.generations import Generation, GenerationLog
from sidecar.core.serialization import log_from_generations

RecordId = tuple[int, str, int]
"""(producer, key, sequence) of one produced record."""


@dataclass(frozen=True, slots=True)
class Acked:
    """A record the sidecar acknowledged: where it landed and under which generation."""

    record: RecordId
    topic: str
    partition: int
    offset: int
    generation: int
    """The generation the produce response named (the one it was routed with)."""
    sidecar: str
    at: float


@dataclass(frozen=True, slots=True)
class Delivery:
    order: int
    at: float
    group: str
    incarnation: str
    topic: str
    partition: int
    offset: int
    record: RecordId | None
    """None for a record that is not one of the run's producers' (a stale probe)."""
    header_generation: int | None


@dataclass(frozen=True, slots=True)
class Handoff:
    order: int
    at: float
    group: str
    incarnation: str
    kind: str
    """``keys_revoked`` or ``keys_assigned``."""
    topic: str
    partition: int
    generation: int
    via: str
    """``callback`` or ``event``."""


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One consumer instance from its creation to its end (a name can have several)."""

    id: str
    group: str
    name: str
    sidecar: str
    started: float


@dataclass(frozen=True, slots=True)
class FaultRecord:
    kind: str
    target: str
    started: float
    ended: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    at: float
    topic: str
    coordinator: str
    via: str
    from_count: int
    target: int
    outcome: str
    """``done``, ``rolled_back``, ``skipped`` (the count was already the target), or
    ``<status> <error_code>`` / an exception name."""
    seconds: float
    final: bool = False
    """One of the changes made after the faults (the change-liveness probe)."""
    count_after: int | None = None
    """The topic's count read right after the answer (None: not readable)."""


@dataclass(frozen=True, slots=True)
class LockSighting:
    """A node of a topic's change lock seen in ZooKeeper: how long it had been there."""

    topic: str
    node: str
    owner: str
    first_seen: float
    last_seen: float
    operation_phase: str
    """The phase of the topic's operation journal when last seen."""


@dataclass
class KeptLog:
    """Every generation of one topic the harness saw in the sidecars' descriptions.

    Compaction folds old generations out of the sidecars' log once their records are
    gone, but the checks still need them: for the records the harness read before it
    deleted them, and for the deliveries and hand-offs of before the fold. A generation
    is immutable once committed, so the union of what was seen is the full log, if no
    generation was committed and folded between two looks (``full`` says so)."""

    initial_count: int
    generations: dict[int, Generation] = field(default_factory=dict)
    disagreements: list[str] = field(default_factory=list)
    """Generations seen with other contents than before (the same number, changed)."""
    sightings: int = 0
    longest: int = 0
    """The most generations a description showed at once."""
    first_kept: int = 0
    """The sidecars' first generation in the latest description (0 until a fold)."""

    def add(self, log: GenerationLog, at: float) -> None:
        self.sightings += 1
        self.longest = max(self.longest, len(log.generations))
        self.first_kept = max(self.first_kept, log.first_number)
        for generation in log.generations:
            held = self.generations.setdefault(generation.number, generation)
            if held != generation:
                self.disagreements.append(
                    f"at {at:.1f} s generation {generation.number} read as {generation}, "
                    f"before as {held}"
                )

    def missing(self) -> list[int]:
        """Generation numbers below the newest seen that were never seen."""
        newest = max(self.generations, default=-1)
        return [n for n in range(newest + 1) if n not in self.generations]

    def full(self) -> GenerationLog:
        """The log from generation 0, as if nothing had been folded. Raises ValueError
        if a generation is missing."""
        missing = self.missing()
        if missing:
            raise ValueError(f"generations never seen: {missing[:10]}")
        return log_from_generations(self.initial_count, list(self.generations.values()))


@dataclass(frozen=True, slots=True)
class Trim:
    """Records the harness deleted below what every group committed (as retention
    would), after reading them for the checks."""

    at: float
    topic: str
    before: dict[int, int]
    """Per partition, the new log start asked for."""
    records: int
    """How many records (read_committed) the harness read and then deleted."""


@dataclass
class History:
    began: float = field(default_factory=time.monotonic)
    acked: dict[RecordId, Acked] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    handoffs: list[Handoff] = field(default_factory=list)
    refused_callbacks: Counter[str] = field(default_factory=Counter)
    incarnations: dict[str, Incarnation] = field(default_factory=dict)
    ended: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Incarnation id -> (when, why) it ended."""
    faults: list[FaultRecord] = field(default_factory=list)
    changes: list[ChangeRecord] = field(default_factory=list)
    produce_requests: int = 0
    produce_refused: Counter[str] = field(default_factory=Counter)
    stale_probes: Counter[str] = field(default_factory=Counter)
    """Outcome of each produce naming an older generation: ``fenced`` is right."""
    stale_accepted: list[str] = field(default_factory=list)
    poll_errors: Counter[str] = field(default_factory=Counter)
    commit_refusals: Counter[str] = field(default_factory=Counter)
    locks: dict[str, LockSighting] = field(default_factory=dict)
    """Lock node path -> what was seen of it."""
    lock_samples_failed: int = 0
    commits: dict[tuple[str, str, int], list[tuple[int, float, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    """(group, topic, partition) -> (order, at, offset) each time a sample of the group's
    committed offsets (about once a second) found it changed."""
    commit_samples_failed: int = 0
    kept_logs: dict[str, KeptLog] = field(default_factory=dict)
    """Topic -> every generation seen (``KeptLog``)."""
    trims: list[Trim] = field(default_factory=list)
    trims_failed: Counter[str] = field(default_factory=Counter)
    """Per topic, trims that failed (a broker or the cluster away): tried again later."""
    notes: list[str] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)
    _incarnations: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    pending: dict[str, set[RecordId]] = field(default_factory=lambda: defaultdict(set))
    """Per group: acknowledged, not yet delivered."""
    seen: dict[str, set[RecordId]] = field(default_factory=lambda: defaultdict(set))
    """Per group: delivered at least once."""
    groups: tuple[str, ...] = ()
    compacted_away: set[RecordId] = field(default_factory=set)
    """Acknowledged records of the compacted topic that compaction removed (a later
    record of the same key in the same partition superseded them): no group has to
    receive them, and a key's sequence may skip them."""

    def now(self) -> float:
        return time.monotonic() - self.began

    def next_order(self) -> int:
        return next(self._order)

    # Producing ---------------------------------------------------------------------------

    def ack(self, acked: Acked) -> None:
        self.acked[acked.record] = acked
        for group in self.groups:
            if acked.record not in self.seen[group] and acked.record not in self.compacted_away:
                self.pending[group].add(acked.record)

    # Consuming ---------------------------------------------------------------------------

    def new_incarnation(self, group: str, name: str, sidecar: str) -> Incarnation:
        incarnation = Incarnation(
            f"{name}.{next(self._incarnations)}", group, name, sidecar, self.now()
        )
        self.incarnations[incarnation.id] = incarnation
        return incarnation

    def end_incarnation(self, incarnation: Incarnation, why: str) -> None:
        self.ended.setdefault(incarnation.id, (self.now(), why))

    def deliver(
        self,
        incarnation: Incarnation,
        topic: str,
        partition: int,
        offset: int,
        record: RecordId | None,
        header_generation: int | None,
    ) -> None:
        self.deliveries.append(
            Delivery(
                self.next_order(),
                self.now(),
                incarnation.group,
                incarnation.id,
                topic,
                partition,
                offset,
                record,
                header_generation,
            )
        )
        if record is not None:
            self.seen[incarnation.group].add(record)
            self.pending[incarnation.group].discard(record)

    def handoff(
        self,
        incarnation: Incarnation,
        kind: str,
        topic: str,
        partition: int,
        generation: int,
        via: str,
        received: tuple[int, float] | None = None,
    ) -> None:
        """Record a hand-off the app was told of; ``received``: the (order, time) at which
        the app received it, when that came before this record."""
        order, at = received if received is not None else (self.next_order(), self.now())
        self.handoffs.append(
            Handoff(
                order,
                at,
                incarnation.group,
                incarnation.id,
                kind,
                topic,
                partition,
                generation,
                via,
            )
        )

    def committed(self, group: str, topic: str, partition: int, offset: int) -> None:
        samples = self.commits[(group, topic, partition)]
        if not samples or samples[-1][2] != offset:
            samples.append((self.next_order(), self.now(), offset))

    def latest_commits(self, group: str, topic: str) -> dict[int, int]:
        """Per partition of ``topic``, the offset ``group`` committed when last sampled."""
        return {
            partition: samples[-1][2]
            for (g, t, partition), samples in self.commits.items()
            if g == group and t == topic and samples
        }

    def excuse(self, records: set[RecordId]) -> None:
        """``records`` were compacted away: nobody has to receive them any more."""
        self.compacted_away |= records
        for group in self.groups:
            self.pending[group] -= records

    def undelivered(self, group: str) -> int:
        return len(self.pending[group])
