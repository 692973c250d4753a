"""What one partition releases to the app in one poll, and what must happen first. Pure.

The release path (``sidecar.service.release``) asks ``PartitionRelease.next_step`` what
to do, does it (awaiting what it must: the group's progress, the app's callback,
ZooKeeper), gathers the inputs again and asks again, until ``Done``: the caller does,
the core decides, as h11's ``Connection.next_event``. Every step is decided from inputs
read after the caller's last await, so a rebalance that began meanwhile, or the
group's acknowledgements just read, count before anything more is done.

The rules, for the records at the head of the partition's buffer (``ReleaseInputs``):

1. Nothing is released from a partition a rebalance is taking, or whose reading
   ended: the partition is done (rule 6 still applies if it is not being revoked).
2. A relocation tombstone at the head is skipped: it settles with the response but
   is never in it (``Skip``), whatever the gate says.
3. A record of an ordered topic (``log`` given) is released only when

   a. it was written under a generation the log knows (else ``ReadLog``, and the
      partition is done for this poll);
   b. the log knows the generation of its offset (a record of generations a compacted
      log folded, buffered since before retention removed it, counts as of the first
      generation it keeps: ``_generation_span``);
   c. the gate of that generation is open: every wait the group has to consume is
      consumed (``sidecar.core.gate``; the group's progress is needed for that:
      ``NeedProgress``; an unmet wait: ``Blocked``, done); the first time it is found
      open in this poll: ``GateOpened``;
   d. the app acknowledged keys_assigned of (partition, generation) (else
      ``TellAssigned``; still not acknowledged after telling it: done);
   e. the group acknowledged keys_revoked of every change that moved keys away from
      the partition at a boundary in (0, offset]: each one not in the ledger is
      looked up in the group's progress first (``NeedProgress``), then told
      (``TellRevoked``, patient); still not acknowledged after that: done.

   One decision covers a run: every later record of the same generation, up to the
   next boundary where keys moved away (``Deliver`` releases the run at once). A run
   of the current generation ends at a record written under a newer one.
4. Records go while the response has room (``Room``); the first record of a
   response always goes. No room for the head: ``ResponseFull`` (release nothing more
   in this poll, from any partition), then the partition ends as below.
5. ``TellAssigned`` and each ``TellRevoked`` come at most once per partition and poll:
   told and still not acknowledged, the event waits in the app's next response.
6. A partition of an ordered topic that released nothing in this poll, and is not
   being revoked, ends by telling each keys_revoked it is due (``revocations_due``:
   delivered up to the boundary, not acknowledged), once the group's acknowledgements
   were read (``NeedProgress``). Events go before records in a response: told beside
   the partition's last records, a revocation would reach the app before them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from sidecar.core.consume import ConsumedRecord
from sidecar.core.gate import GroupProgress, Wait, unmet, waits_into
from sidecar.core.generations import GenerationLog
from sidecar.core.handoff import (
    HandoffKind,
    HandoffLedger,
    Revocation,
    Subject,
    revocation_points,
    revocations_due,
)
from sidecar.core.placement import RELOCATION_HEADER, header_value, routed_generation

R = TypeVar("R", bound=ConsumedRecord)

_NO_END = 1 << 63


@dataclass(frozen=True, slots=True)
class Room:
    """What the response being built can still take."""

    max_bytes: int | None
    """The response's limit on keys and values, in bytes (None: no limit)."""
    used: int = 0
    """Bytes of keys and values released into the response so far."""
    records: int = 0
    """Records released into the response so far, from every partition."""


@dataclass(frozen=True, slots=True)
class ReleaseInputs(Generic[R]):
    """What one step looks at, read after the caller's last await."""

    head: Sequence[R]
    """The partition's buffered records, in offset order (the positions model's
    ``PartitionPosition.buffer``, not copied)."""
    delivered: int | None
    """``PartitionPosition.delivered``: every offset below it reached the app."""
    log: GenerationLog | None
    """The topic's generation log, as last read; None: the topic is not ordered (no gate,
    no hand-off)."""
    progress: GroupProgress | None
    """The group's progress in the topic, read in this poll; None: not read yet."""
    ledger: HandoffLedger
    """What the app was told of key hand-off and acknowledged, and what the group did."""
    room: Room
    revoking: bool = False
    """A rebalance is taking the partition."""
    reading_ended: bool = False
    """The partition's state was replaced since the release began (a new reading)."""


@dataclass(frozen=True, slots=True)
class Deliver:
    """Release the first ``count`` records of the head into the response (none of them
    a relocation tombstone): ``size`` bytes of keys and values."""

    count: int
    size: int


@dataclass(frozen=True, slots=True)
class Skip:
    """The head is a relocation tombstone: skip it (``Positions.skip``)."""


@dataclass(frozen=True, slots=True)
class NeedProgress:
    """Read the group's progress in the topic (and its keys_revoked acknowledgements,
    into the ledger), then ask again."""


@dataclass(frozen=True, slots=True)
class ReadLog:
    """The head was written under generation ``generation``, newer than the log: read
    the topic's log again. Nothing more is released from the partition in this poll."""

    generation: int


@dataclass(frozen=True, slots=True)
class Blocked:
    """The gate of the head's generation waits for the group to consume these: announce
    them. Nothing more is released from the partition in this poll."""

    waits: tuple[Wait, ...]


@dataclass(frozen=True, slots=True)
class GateOpened:
    """The gate of ``subject`` (its generation in the partition) is open, found so by
    the record at ``offset``: withdraw the topic's announced waits; audit it."""

    subject: Subject
    offset: int


@dataclass(frozen=True, slots=True)
class TellAssigned:
    """Tell the app keys_assigned for ``subject`` (the head's generation is gated)."""

    subject: Subject


@dataclass(frozen=True, slots=True)
class TellRevoked:
    """Tell the app that keys of the partition moved away at ``revocation``: before a
    record past its boundary is released (``patient``: the release waits for the
    app's callback), or, at the end of a poll that released nothing of the partition,
    because it was delivered up to the boundary (one try per poll: a failed callback
    is tried again at the next one)."""

    revocation: Revocation
    patient: bool


@dataclass(frozen=True, slots=True)
class ResponseFull:
    """The response has no room for the head: release nothing more in this poll, from
    any partition. The partition's end follows."""


@dataclass(frozen=True, slots=True)
class Done:
    """Nothing more to do for the partition in this poll."""


Step = (
    Deliver
    | Skip
    | NeedProgress
    | ReadLog
    | Blocked
    | GateOpened
    | TellAssigned
    | TellRevoked
    | ResponseFull
    | Done
)

_SKIP, _NEED_PROGRESS, _FULL, _DONE = Skip(), NeedProgress(), ResponseFull(), Done()

_Checked = Step | Literal[True] | None
"""True: the record may be released; a step to take first; None: the partition
releases no more in this poll."""


def _generation_span(log: GenerationLog, partition: int, offset: int) -> tuple[int, int | None]:
    """``log.generation_span``, and for a record that a compacted log's folded
    generations wrote, the first generation it keeps, up to its first boundary.

    Such a record is below the partition's log start (``sidecar.core.compaction`` folds
    a generation only then), yet a consumer that fetched it before retention removed it
    may still hold it when the compacted log is read. Judged as a record of the first
    kept generation, its waits are the folded ones: every wait its own generation had,
    at a boundary as high or higher (``waits_into`` only grows with the generation), and
    all met when it was folded (its sources' log starts are past them, and every group
    that read a source acknowledged its revocations). Its keys_assigned is told as the
    first kept generation's, before it. Without this the partition would release
    nothing more: the log no longer knows the generation of its offset.
    Raises ValueError as ``generation_span`` does otherwise.
    """
    try:
        return log.generation_span(partition, offset)
    except ValueError:
        first = log.generations[0]
        boundary = first.boundary(partition)
        if first.number == 0 or boundary is None or offset >= boundary:
            raise
        return first.number, boundary


def is_relocation_tombstone(record: ConsumedRecord) -> bool:
    """Relocation tombstones are tombstones: only null values are looked at."""
    return record.value is None and header_value(record.headers, RELOCATION_HEADER) == b"1"


def record_size(record: ConsumedRecord) -> int:
    """What a record counts against a response's ``max_bytes``: its key and value."""
    return len(record.key or b"") + len(record.value or b"")


class PartitionRelease(Generic[R]):
    """One partition's release in one poll (the rules of the module docstring).

    Stateful but pure: what it returned is remembered (a gate found open, an event
    told, a run decided), so that each is done once; a new one is made per partition
    and poll.
    """

    def __init__(self, topic: str, partition: int, *, managed: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.managed = managed
        """The topic is managed by the sidecars: its relocation tombstones are skipped."""
        self._delivering = True
        """Rules 1-5 apply; once False, only the partition's end (rule 6)."""
        self._released = False
        self._log: GenerationLog | None = None
        """The log the decided run was decided with."""
        self._decided_until = -1
        """Records below this offset need no gate or keys_revoked check in this poll."""
        self._decided_generation: int | None = None
        """The generation of the run up to ``_decided_until`` when that run ends only
        where the log does (the current generation, which may be 0); None otherwise."""
        self._gate_found_open: set[int] = set()
        self._opened: set[int] = set()
        """Generations whose gate is open and whose keys_assigned is acknowledged."""
        self._assigned_told: set[int] = set()
        self._revoked_told: set[int] = set()
        """Generations of the revocations told in this poll (rules 3e and 6)."""

    def next_step(self, inputs: ReleaseInputs[R]) -> Step:
        """What to do next (see the module docstring)."""
        if self._delivering:
            step = self._delivery_step(inputs)
            if step is not None:
                return step
            self._delivering = False
        return self._end_step(inputs)

    # Rules 1-5 --------------------------------------------------------------------------------

    def _delivery_step(self, inputs: ReleaseInputs[R]) -> Step | None:
        """The next step while delivering; None once the partition delivers no more."""
        if inputs.revoking or inputs.reading_ended or not inputs.head:
            return None
        head = inputs.head[0]
        if self.managed and is_relocation_tombstone(head):
            return _SKIP
        log = inputs.log
        if log is not None:
            if log is not self._log:
                # Read anew meanwhile: a run decided with the older log is decided again.
                self._log, self._decided_until, self._decided_generation = log, -1, None
            if not self._decided(head):
                checked = self._check(log, head, inputs)
                if checked is not True:
                    return checked
                self._decide_run(log, head.offset)
        return self._run(inputs)

    def _check(self, log: GenerationLog, record: R, inputs: ReleaseInputs[R]) -> _Checked:
        """Rule 3 for ``record`` (see ``_Checked``)."""
        gate = self._gate(log, record, inputs)
        if gate is not True:
            return gate
        return self._revoked_before(log, record.offset, inputs)

    def _gate(self, log: GenerationLog, record: R, inputs: ReleaseInputs[R]) -> _Checked:
        """Rules 3a-3d."""
        written = routed_generation(record.headers)
        if written is not None and written > log.current.number:
            self._delivering = False
            return ReadLog(written)
        try:
            generation, _ = _generation_span(log, self.partition, record.offset)
        except ValueError:
            return None  # a partition or an offset the log does not know yet
        if generation in self._opened:
            return True
        waits = waits_into(log, self.partition, generation)
        if not waits:
            return True
        if inputs.progress is None:
            return _NEED_PROGRESS
        missing = unmet(waits, inputs.progress)
        if missing:
            self._delivering = False
            return Blocked(missing)
        subject = Subject(self.topic, self.partition, generation)
        if generation not in self._gate_found_open:
            self._gate_found_open.add(generation)
            return GateOpened(subject, record.offset)
        if not inputs.ledger.acknowledged(HandoffKind.KEYS_ASSIGNED, *subject):
            if generation in self._assigned_told:
                return None  # told: its event waits in the response for the app
            self._assigned_told.add(generation)
            return TellAssigned(subject)
        self._opened.add(generation)
        return True

    def _revoked_before(
        self, log: GenerationLog, offset: int, inputs: ReleaseInputs[R]
    ) -> _Checked:
        """Rule 3e. Asked before delivering a record past a boundary, not only before
        committing it: a rebalance between delivering it and committing it would
        deliver it again."""
        for revocation in revocation_points(log, self.partition):
            if not 0 < revocation.boundary <= offset:
                continue
            if inputs.ledger.acknowledged(
                HandoffKind.KEYS_REVOKED, self.topic, revocation.partition, revocation.generation
            ):
                continue
            if inputs.progress is None:
                # Another instance may have got it acknowledged (this partition's owner
                # before a rebalance): the group's acknowledgements are read first.
                return _NEED_PROGRESS
            if revocation.generation in self._revoked_told:
                return None  # told: its event waits in the response for the app
            self._revoked_told.add(revocation.generation)
            return TellRevoked(revocation, patient=True)
        return True

    def _decided(self, record: R) -> bool:
        """True if ``record`` lies in the run decided last: released without asking
        again (one decision per run of records, not per record)."""
        if record.offset >= self._decided_until:
            return False
        if self._decided_generation is not None:
            # A run of the current generation ends only where the log does; a record
            # written under a generation this sidecar has not read yet must be judged.
            written = routed_generation(record.headers)
            return written is None or written <= self._decided_generation
        return True

    def _decide_run(self, log: GenerationLog, offset: int) -> None:
        """Rule 3 held for the record at ``offset``: it holds for every later record of
        its generation up to the next boundary where keys moved away."""
        _, end = _generation_span(log, self.partition, offset)
        next_revocation = min(
            (r.boundary for r in revocation_points(log, self.partition) if r.boundary > offset),
            default=None,
        )
        ends = [bound for bound in (end, next_revocation) if bound is not None]
        self._decided_until = min(ends) if ends else _NO_END
        self._decided_generation = log.current.number if end is None else None

    def _run(self, inputs: ReleaseInputs[R]) -> Step:
        """The head's run: decided, no tombstone, as much as the response has room for."""
        room, gated = inputs.room, inputs.log is not None
        count = size = 0
        for record in inputs.head:
            if count and (
                (self.managed and is_relocation_tombstone(record))
                or (gated and not self._decided(record))
            ):
                break
            size_of = record_size(record)
            if (
                room.max_bytes is not None
                and room.records + count > 0
                and room.used + size + size_of > room.max_bytes
            ):
                if count:
                    break
                self._delivering = False
                return _FULL
            count += 1
            size += size_of
        self._released = True
        return Deliver(count, size)

    # Rule 6 -----------------------------------------------------------------------------------

    def _end_step(self, inputs: ReleaseInputs[R]) -> Step:
        log, delivered = inputs.log, inputs.delivered
        if log is None or inputs.revoking or self._released or delivered is None:
            return _DONE
        acknowledged = inputs.ledger.revocations(self.topic)
        due = [
            revocation
            for revocation in revocations_due(log, self.partition, delivered, acknowledged)
            if revocation.generation not in self._revoked_told
        ]
        if not due:
            return _DONE
        if inputs.progress is None:
            return _NEED_PROGRESS  # the group's acknowledgements, read once per poll
        self._revoked_told.add(due[0].generation)
        return TellRevoked(due[0], patient=False)
