"""Where one consumer instance stands in each partition it reads: one checked model. Pure.

Per partition, in offset order::

    committed <= delivered <= (in flight) <= (buffer) <= fetched

- ``fetched``: where the Kafka consumer's next fetch of the partition starts, as its
  last fetch left it.
- ``buffer``: records taken from fetches and not released yet.
- in flight: records released into a response that is not known to be sent yet.
- ``delivered``: every offset below it was sent to the app, or proven to hold no record
  for the app (a transaction marker, an aborted record, a relocation tombstone).
- ``committed``: what this instance last committed for the group.

**Readings.** A partition is read in *readings*: one assignment of the consumer (its
``incarnation``, counted by the adapter: aiokafka makes a new assignment object at every
rebalance and manual assignment, and starts its positions from the group's committed
offsets) and, within it, the seeks this instance made (``seek_epoch``). Everything a
fetch returns belongs to the reading it was fetched in; a fetch is always taken whole or,
if its reading has ended, not at all.

**The invariants** (``check`` states them; the property tests drive every interleaving):

1. ``delivered`` passes an offset only when the record there was sent to the app, or
   when the consumer proved in the *same reading* that no record for the app is there:
   it is below a position that reading's consumer reported while every record it had
   returned in that reading was taken here. So a position read from another assignment,
   or before a seek, never moves ``delivered`` (the cause of two chaos-run losses: a
   state made during a rebalance took the old assignment's position).
2. A commit never passes ``delivered``, and ``delivered`` never passes a record in flight:
   a rebalance that commits while a response is being written commits only what was sent.
3. A fetch whose reading ended (a rebalance revoked it, another assignment replaced it, a
   seek moved it) is dropped, and nothing of it is lost: the consumer starts the next
   reading from the group's committed offset, or from the seek's target, and every
   record not delivered lies at or above the former (invariant 2).
4. Once a reading is revoked, no state is made for it again, also by a fetch that
   returns after the revocation: aiokafka keeps the old assignment current until the
   rebalance gives it a new one.
5. Records within a partition's buffer and in flight are in strictly increasing offset
   order, and above ``delivered``.

The service feeds the consumer's observations in (``follow``, ``take``, ``revoked``,
``begin_seek`` / ``seek_landed``) and the release path's decisions (``release``,
``skip``, ``sent``, ``unsent``, ``committed``); nothing here awaits, reads a clock or
logs. ``take`` returns what it dropped, for the caller to log.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sidecar.core.consume import LastBatch, Offsetted, TopicPartition

R = TypeVar("R", bound=Offsetted)


@dataclass(frozen=True, slots=True)
class Fetch(Generic[R]):
    """What one fetch of the consumer returned, observed in the step it returned in."""

    incarnation: int
    """The consumer's assignment the fetch was made from (see the module docstring)."""
    seek_epoch: int
    """``Positions.seek_epoch`` when the fetch returned."""
    batches: Mapping[TopicPartition, Sequence[R]]
    positions: Mapping[TopicPartition, int]
    """Every assigned partition's fetch position right after the fetch returned (those
    whose position is known): past the records returned, and past the markers and
    aborted records among and after them."""
    last_batches: Mapping[TopicPartition, LastBatch] = field(default_factory=dict)
    """The partitions whose position a fetch moved to ``positions[tp]``, with the leader
    epoch of the last batch read (not used here: ``core.commit_epochs``)."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """Records of a fetch not taken, because their reading had ended (for a log line)."""

    tp: TopicPartition
    first: int
    last: int
    reason: str


@dataclass(slots=True)
class PartitionPosition(Generic[R]):
    """One partition's positions in one reading. Read by the service; changed only by
    ``Positions``."""

    incarnation: int
    seek_stamp: int
    """``Positions.seek_epoch`` when this reading began (0: at the assignment)."""
    buffer: deque[R] = field(default_factory=deque)
    in_flight: list[tuple[R, bool]] = field(default_factory=list)
    """Released records not known to be sent yet, each with "hidden" (skipped, never in
    a response: a relocation tombstone)."""
    fetched: int | None = None
    delivered: int | None = None
    sent_to: int | None = None
    """Next offset after the last record sent to the app (not counting what was skipped)."""
    committed: int | None = None

    @property
    def released_to(self) -> int | None:
        """Next offset after the last record released (sent or in flight)."""
        return self.in_flight[-1][0].offset + 1 if self.in_flight else self.delivered

    def _held_to(self) -> int | None:
        """Next offset after the last record held here (in flight or buffered)."""
        if self.buffer:
            return self.buffer[-1].offset + 1
        if self.in_flight:
            return self.in_flight[-1][0].offset + 1
        return None

    def _advance(self) -> None:
        """Move ``delivered`` over what the reading proved holds nothing for the app: up to
        the buffer's head, or with an empty buffer up to the fetch position. Not while a
        response is in flight: ``delivered`` then waits for it (invariant 2)."""
        if self.in_flight:
            return
        floor = self.buffer[0].offset if self.buffer else self.fetched
        if floor is not None and (self.delivered is None or floor > self.delivered):
            self.delivered = floor


class Positions(Generic[R]):
    """Every partition of one consumer instance (see the module docstring)."""

    def __init__(self) -> None:
        self._states: dict[TopicPartition, PartitionPosition[R]] = {}
        self.seek_epoch = 0
        """Seeks made by this instance, counted."""
        self._newest_incarnation = 0
        """The newest assignment seen: fetches of an older one are dropped."""
        self._revoked_through = 0
        """Assignments up to this one were revoked: no state is made for them again."""

    # Reading the states ------------------------------------------------------------------

    def __contains__(self, tp: object) -> bool:
        return tp in self._states

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def get(self, tp: TopicPartition) -> PartitionPosition[R] | None:
        return self._states.get(tp)

    def __getitem__(self, tp: TopicPartition) -> PartitionPosition[R]:
        return self._states[tp]

    def items(self) -> list[tuple[TopicPartition, PartitionPosition[R]]]:
        return list(self._states.items())

    def topics(self) -> set[str]:
        return {tp.topic for tp in self._states}

    def full(self, assigned: Iterable[TopicPartition], limit: int) -> list[TopicPartition]:
        """The partitions of ``assigned`` whose buffers hold ``limit`` records or more."""
        full = []
        for tp in assigned:
            state = self._states.get(tp)
            if state is not None and len(state.buffer) >= limit:
                full.append(tp)
        return full

    # The consumer's observations ------------------------------------------------------------

    def follow(self, assigned: Iterable[TopicPartition], incarnation: int) -> list[TopicPartition]:
        """The consumer's assignment is ``assigned`` in ``incarnation``: states of other
        partitions or older assignments go, and assigned partitions get a state unless
        the assignment was revoked (invariant 4). Returns the partitions whose state went."""
        self._see(incarnation)
        assigned = set(assigned)
        gone = [
            tp
            for tp, state in self._states.items()
            if tp not in assigned or state.incarnation < incarnation
        ]
        for tp in gone:
            del self._states[tp]
        if incarnation > self._revoked_through:
            for tp in assigned:
                if tp not in self._states:
                    self._states[tp] = PartitionPosition(incarnation, 0)
        return gone

    def revoked(self, incarnation: int) -> None:
        """A rebalance revoked the consumer's assignment ``incarnation`` (and everything
        before it): every state goes, and none is made for it again."""
        self._see(incarnation)
        self._revoked_through = max(self._revoked_through, incarnation)
        self._states.clear()

    def reset(self) -> None:
        """The consumer is gone (unsubscribed, closed): nothing of it is read again."""
        self._revoked_through = self._newest_incarnation
        self._states.clear()

    def begin_seek(self, tp: TopicPartition, incarnation: int) -> None:
        """This instance is about to move the consumer's position in ``tp``: a new reading,
        whose start ``seek_landed`` gives once the consumer knows it. Fetches that return
        before the seek are dropped, from here on (invariant 3)."""
        self._see(incarnation)
        self.seek_epoch += 1
        self._states[tp] = PartitionPosition(incarnation, self.seek_epoch)

    def seek_landed(self, tp: TopicPartition, offset: int) -> None:
        """The seek begun last for ``tp`` put the consumer at ``offset``. Everything
        before it counts as delivered: the app asked to move there."""
        state = self._states.get(tp)
        if state is None or state.seek_stamp == 0 or state.fetched is not None:
            return  # revoked meanwhile, or a fetch from the new position came first
        state.fetched = state.delivered = offset

    def seek(self, tp: TopicPartition, offset: int, incarnation: int) -> None:
        """Both steps of a seek at once (the consumer takes the offset as it is)."""
        self.begin_seek(tp, incarnation)
        self.seek_landed(tp, offset)

    def take(self, fetch: Fetch[R]) -> list[Dropped]:
        """Buffer what a fetch returned, and its positions. Returns what it dropped."""
        self._see(fetch.incarnation)
        dropped: list[Dropped] = []
        for tp in set(fetch.batches) | set(fetch.positions):
            records = fetch.batches.get(tp, ())
            state = self._reading_state(tp, fetch)
            if state is None:
                if records:
                    dropped.append(
                        Dropped(tp, records[0].offset, records[-1].offset, self._why(tp, fetch))
                    )
                continue
            held_to = state._held_to()
            floor = max(
                (bound for bound in (state.fetched, held_to, state.delivered) if bound is not None),
                default=None,
            )
            # Within a reading the consumer's records continue from its position; records
            # below what is held came again after the consumer's position moved back (an
            # out-of-range reset) and were taken already.
            kept = records if floor is None else [r for r in records if r.offset >= floor]
            state.buffer.extend(kept)
            positions = [] if not kept else [kept[-1].offset + 1]
            if tp in fetch.positions:
                positions.append(fetch.positions[tp])
            if positions:
                reached = max(positions)
                if state.fetched is None or reached > state.fetched:
                    state.fetched = reached
            state._advance()
        return dropped

    def reading_of(
        self, tp: TopicPartition, incarnation: int, seek_epoch: int
    ) -> tuple[int, int] | None:
        """The reading of ``tp`` that a fetch made in ``incarnation`` at ``seek_epoch``
        belongs to, as (incarnation, seek stamp): the one ``take`` would put its records
        in (a new one at the assignment if ``tp`` has no state of that assignment yet).
        None if that reading has ended (``take`` would drop them)."""
        if incarnation < self._newest_incarnation or incarnation <= self._revoked_through:
            return None
        state = self._states.get(tp)
        if state is None or state.incarnation < incarnation:
            return (incarnation, 0)
        if seek_epoch < state.seek_stamp:
            return None
        return (state.incarnation, state.seek_stamp)

    def _reading_state(self, tp: TopicPartition, fetch: Fetch[R]) -> PartitionPosition[R] | None:
        """The state ``fetch`` belongs to, made if its reading is the newest and has none
        yet (a fetch may return before the rebalance listener runs); None if its reading
        ended."""
        if fetch.incarnation < self._newest_incarnation:
            return None
        if fetch.incarnation <= self._revoked_through:
            return None
        state = self._states.get(tp)
        if state is None or state.incarnation < fetch.incarnation:
            state = self._states[tp] = PartitionPosition(fetch.incarnation, 0)
        if fetch.seek_epoch < state.seek_stamp:
            return None  # returned before a seek of the partition
        return state

    def _why(self, tp: TopicPartition, fetch: Fetch[R]) -> str:
        if fetch.incarnation <= self._revoked_through:
            return "its assignment was revoked"
        if fetch.incarnation < self._newest_incarnation:
            return "the consumer was assigned anew"
        return "the partition was sought"

    def _see(self, incarnation: int) -> None:
        if incarnation > self._newest_incarnation:
            self._newest_incarnation = incarnation
            for tp in [tp for tp, s in self._states.items() if s.incarnation < incarnation]:
                del self._states[tp]

    # The release path's decisions -------------------------------------------------------------

    def release(self, tp: TopicPartition) -> R:
        """The buffer's head goes into the response being built. Raises IndexError if
        the buffer is empty, KeyError if ``tp`` has no state."""
        state = self._states[tp]
        record = state.buffer.popleft()
        state.in_flight.append((record, False))
        return record

    def skip(self, tp: TopicPartition) -> R:
        """The buffer's head is never for the app (a relocation tombstone): it settles
        with the response being built, and goes back with it if that is not sent."""
        state = self._states[tp]
        record = state.buffer.popleft()
        state.in_flight.append((record, True))
        return record

    def sent(self) -> None:
        """The response with everything in flight reached the app."""
        for state in self._states.values():
            if not state.in_flight:
                continue
            state.delivered = state.in_flight[-1][0].offset + 1
            shown = [record for record, hidden in state.in_flight if not hidden]
            if shown:
                state.sent_to = shown[-1].offset + 1
            state.in_flight.clear()
            state._advance()

    def unsent(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """The response was not sent (or not the records of ``partitions`` in it): what
        was in flight is at the head again."""
        chosen = (
            self._states.values()
            if partitions is None
            else (self._states[tp] for tp in set(partitions) if tp in self._states)
        )
        for state in chosen:
            if state.in_flight:
                state.buffer.extendleft(record for record, _ in reversed(state.in_flight))
                state.in_flight.clear()

    def committable(self, tp: TopicPartition, offset: int) -> bool:
        """True if ``offset`` may be committed for ``tp`` (invariant 2)."""
        state = self._states.get(tp)
        return state is not None and state.delivered is not None and offset <= state.delivered

    def committed(self, tp: TopicPartition, offset: int) -> None:
        """This instance committed ``offset`` for ``tp``. Raises ValueError past
        ``delivered`` (the caller checks ``committable`` first)."""
        state = self._states.get(tp)
        if state is None:
            return  # revoked while the commit was in flight: its next owner reads on
        if not self.committable(tp, offset):
            raise ValueError(f"{tp} commit {offset} passes delivered {state.delivered}")
        state.committed = offset

    # Checks -----------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise AssertionError if an invariant of the module docstring does not hold."""
        for tp, state in self._states.items():
            held = [r.offset for r, _ in state.in_flight] + [r.offset for r in state.buffer]
            if any(a >= b for a, b in itertools.pairwise(held)):
                raise AssertionError(f"{tp}: held offsets out of order: {held}")
            if held and state.delivered is not None and held[0] < state.delivered:
                raise AssertionError(f"{tp}: delivered {state.delivered} passes held {held[0]}")
            if state.committed is not None and (
                state.delivered is None or state.committed > state.delivered
            ):
                raise AssertionError(
                    f"{tp}: committed {state.committed} passes delivered {state.delivered}"
                )
            if state.incarnation <= self._revoked_through:
                raise AssertionError(f"{tp}: a state of revoked assignment {state.incarnation}")
