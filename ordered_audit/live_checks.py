"""The live audit's checks: those of ``ordered_audit.checks``, one micro-batch at a time,
in plain Python over state kept in memory.

No Spark and no IO: ``check_batch`` takes the state the previous batches left (and
changes it), the new batch of events (dicts, as ``parse_events`` makes them from the
audit topic's JSON) and a ``cutoff`` (event time; None keeps everything), and returns
the anomalies the batch reveals, as dicts with ``kinds.ANOMALY_FIELDS``. Run over a
whole history cut into batches, they are the anomalies the batch checks find over the
whole history, each reported once, in the batch that reveals it (the tests hold them to
that). Why not DataFrames: a micro-batch of the DataFrame checks ran a dozen Spark jobs
and rewrote the whole state, 10 s or more whatever its size; here a batch costs a few
microseconds per event, and the state is written as a journal of batches (see
``ordered_audit.stream``).

Each check keeps, per key or partition, the rows the batch check would compare a new
event with. A row remembers whether it was already reported (``flagged``): an old row
that a late-arriving event shows to be wrong is reported once, when that event comes,
and never again. Events are put in delivery order (time, sidecar, seq) before they are
compared, so an event that comes in a later batch than newer ones of its key is
checked where it belongs, not where it arrived.

The state is bounded by the cutoff (the caller's event-time watermark less a horizon):
rows older than it are dropped, except the few that every later event is compared
with, which are kept for good. Each check queues its rows in the order they came and
drops them from the front of the queue while they are older than the cutoff: a row
queued behind a newer one (an event that came out of time order) outlives the cutoff
until that one goes, so the checks may remember a little more than the horizon, never
less, and a batch costs the same however large the state.

- ``nonmonotonic``: the highest seq delivered per (group, topic, producer, key). A
  delivery is late when a higher seq was delivered before it, and that is the highest
  one. What the horizon bounds is the memory of *which* seqs were delivered: a
  re-delivery of a seq first delivered more than the horizon before, below the highest,
  is taken for a first delivery and reported (a false positive), and an event arriving
  that far out of time order is compared with the highest seq only.
- ``written_across_barrier``: the lowest and highest offset per (topic, partition,
  generation). A record is across a barrier when a newer generation's lowest offset is
  below it, so that stays exact; what the horizon bounds is an older record the batch
  shows to be above a newer generation: beyond the horizon only the highest of its
  generation is reported, not every one.
- ``gate_evidence``, ``unaudited_delivery`` and ``consumer_truncated`` need no state:
  each is about one event.
- ``lost`` judges an acknowledged record once the cutoff has passed its acknowledgement
  (see ``_Lost``).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import sys
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import NoneType
from typing import Any

import orjson

from ordered_audit import kinds

Event = dict[str, Any]
Anomaly = dict[str, Any]

STREAM_KINDS = (
    kinds.LOST,
    kinds.NONMONOTONIC,
    kinds.WRITTEN_ACROSS_BARRIER,
    kinds.GATE_EVIDENCE,
    kinds.UNAUDITED_DELIVERY,
    kinds.CONSUMER_TRUNCATED,
)
"""Every kind the live audit reports (a fixed set: the metric's ``kind`` label)."""

SCHEMA_VERSION = 1
"""The audit events' schema this module reads (``sidecar.audit.events.SCHEMA_VERSION``)."""

# The event fields and their types, as ``sources.EVENT_SCHEMA`` has them (a test holds
# the two equal): a value of another type is taken as absent, as Spark's JSON reader
# takes it.
_LONG = "long"
_DOUBLE = "double"
_STRING = "string"
_BOOLEAN = "boolean"
_EVIDENCE = "evidence"
EVENT_FIELDS: dict[str, str] = {
    "schema": _LONG,
    "type": _STRING,
    "sidecar": _STRING,
    "seq": _LONG,
    "time": _DOUBLE,
    "topic": _STRING,
    "partition": _LONG,
    "offset": _LONG,
    "key": _STRING,
    "generation": _LONG,
    "count": _LONG,
    "producer": _STRING,
    "producer_seq": _LONG,
    "ordered": _BOOLEAN,
    "assignment": _LONG,
    "group": _STRING,
    "instance": _STRING,
    "evidence": _EVIDENCE,
    "kind": _STRING,
    "from_generation": _LONG,
    "from_count": _LONG,
    "target_count": _LONG,
    "phase": _STRING,
    "coordinator": _STRING,
    "result": _STRING,
    "position": _LONG,
    "leader_epoch": _LONG,
    "resume_at": _LONG,
    "lost": _LONG,
}
EVIDENCE_FIELDS: dict[str, str] = {
    "source": _LONG,
    "boundary": _LONG,
    "committed": _LONG,
    "log_start": _LONG,
    "mode": _STRING,
}


# Events -------------------------------------------------------------------------------


def _typed(value: Any, kind: str) -> Any:
    if kind == _LONG:
        return value if type(value) is int else None
    if kind == _DOUBLE:
        if type(value) is float:
            return value if math.isfinite(value) else None
        return float(value) if type(value) is int else None
    if kind == _STRING:
        return value if type(value) is str else None
    if kind == _BOOLEAN:
        return value if type(value) is bool else None
    if not isinstance(value, list):
        return None
    return [
        {name: _typed(item.get(name), t) for name, t in EVIDENCE_FIELDS.items()}
        for item in value
        if isinstance(item, dict)
    ]


# Each field's type as json gives it, where a value of that type is taken as it is.
_AS_THEY_ARE: dict[str, type] = {
    name: {_LONG: int, _STRING: str, _BOOLEAN: bool, _DOUBLE: float}[kind]
    for name, kind in EVENT_FIELDS.items()
    if kind != _EVIDENCE
}


Shape = tuple[tuple[str, ...], tuple[type, ...]]
"""An event's field names and the types of their values, in order."""
_SHAPES: dict[Shape, tuple[str, ...] | None] = {}
"""What ``_as_it_is`` says of each shape seen: the emitters write a few."""
_MAX_SHAPES = 1_024


def _as_it_is(shape: Shape) -> tuple[str, ...] | None:
    """The fields whose value is none, when every other is known and of its type (an
    event of this shape conforms once they are gone); None when some field is not."""
    names, kinds = shape
    if all(
        kind is NoneType or _AS_THEY_ARE.get(name) is kind
        for name, kind in zip(names, kinds, strict=True)
    ):
        return tuple(name for name, kind in zip(names, kinds, strict=True) if kind is NoneType)
    return None


def conform(raw: dict[str, Any]) -> Event:
    """``raw`` with the known fields only, each of its type or None (absent). Usually
    ``raw`` itself, its fields of value none taken out."""
    # The common case by the event's shape: two tuples built in C and a lookup,
    # against a check of every field (measured 0.11 against 0.19 s for 100,000
    # events).
    shape = (tuple(raw), tuple(map(type, raw.values())))
    try:
        nones = _SHAPES[shape]
    except KeyError:
        nones = _as_it_is(shape)
        if len(_SHAPES) < _MAX_SHAPES:
            _SHAPES[shape] = nones
    if nones is not None:
        for name in nones:
            del raw[name]
        if math.isfinite(raw.get("time", 0.0)):
            return raw
    event: Event = {}
    for name, value in raw.items():
        kind = EVENT_FIELDS.get(name)
        if kind is not None and value is not None:
            typed = _typed(value, kind)
            if typed is not None:
                event[name] = typed
    return event


def _decoded(values: Sequence[str | bytes | None]) -> list[Any]:
    """Each value's JSON (None where it is none or not JSON). orjson, as Spark's reader,
    takes no NaN or Infinity; unlike it, no integer beyond 64 bits (its value is then
    none). Each value is read alone: measured faster than the batch joined into one
    JSON array and read at once (0.21 against 0.32-0.44 s for 250,000 events)."""
    try:
        return list(map(orjson.loads, values))  # type: ignore[arg-type]
    except (orjson.JSONDecodeError, TypeError):
        pass  # a value that is none or not JSON: read them one by one
    decoded = []
    for value in values:
        try:
            decoded.append(orjson.loads(value) if value is not None else None)
        except orjson.JSONDecodeError:
            decoded.append(None)
    return decoded


_RECURRING = ("sidecar", "topic", "group", "producer", "instance", "key")
"""String fields whose values recur from event to event."""


@dataclass(frozen=True, slots=True)
class Parsed:
    events: list[Event]
    """The events of this module's schema, each once, in delivery order."""
    other_schema: int
    """Events of another schema version (left out)."""
    unreadable: int
    """Values that are not an event: not JSON, not an object, or no type, time,
    sidecar or seq (left out)."""


def parse_events(values: Sequence[str | bytes | None]) -> Parsed:
    """The audit topic's record values (one event's JSON each) as events: conformed,
    without repeats of one event (the same sidecar, seq, time and type: a record sent
    twice), sorted in delivery order."""
    events: list[Event] = []
    seen: set[tuple[Any, ...]] = set()
    other = unreadable = 0
    for raw in _decoded(values):
        if type(raw) is not dict:
            unreadable += 1
            continue
        event = conform(raw)
        get = event.get
        identity = (get("sidecar"), get("seq"), get("time"), get("type"))
        if None in identity:
            unreadable += 1
        elif get("schema") != SCHEMA_VERSION:
            other += 1
        elif identity not in seen:
            seen.add(identity)
            # One string for each name that recurs: the state keeps many of them.
            for name in _RECURRING:
                value = get(name)
                if value is not None:
                    event[name] = sys.intern(value)
            events.append(event)
    events.sort(key=delivery_order)
    return Parsed(events, other, unreadable)


def delivery_order(event: Mapping[str, Any]) -> tuple[float, str, int]:
    """The order in which one group saw its records: the emitting sidecar's clock, then
    its audit sequence (``checks._DELIVERY_ORDER``)."""
    return (event["time"], event["sidecar"], event["seq"])


def _anomaly(kind: str, detail: str, row: Mapping[str, Any]) -> Anomaly:
    found: Anomaly = {"kind": kind, "detail": detail}
    for name in kinds.ANOMALY_FIELDS[2:]:
        found[name] = row.get(name)
    return found


def _d(value: int | None) -> str:
    """A number as Spark's ``format_string`` writes it with %d (null: "null")."""
    return "null" if value is None else str(value)


# nonmonotonic -------------------------------------------------------------------------


class _Delivery:
    """The first delivery of one seq to one group."""

    __slots__ = ("flagged", "generation", "instance", "offset", "order", "partition", "seq")

    def __init__(
        self,
        order: tuple[float, str, int],
        seq: int,
        partition: int | None,
        offset: int | None,
        generation: int | None,
        instance: str | None,
    ) -> None:
        self.order = order
        self.seq = seq
        self.partition = partition
        self.offset = offset
        self.generation = generation
        self.instance = instance
        self.flagged = False

    def highest(self) -> tuple[int, int, int]:
        """What ``checks.with_newest_before`` takes the max of: (seq, partition, offset)."""
        return (self.seq, _low(self.partition), _low(self.offset))


def _low(value: int | None) -> int:
    # Spark orders null below every number in a struct's max.
    return -1 if value is None else value


class _KeyDeliveries:
    """One (group, topic, producer, key)'s first deliveries of each seq."""

    __slots__ = ("highest", "last", "rows")

    def __init__(self) -> None:
        self.rows: dict[int, _Delivery] = {}
        self.last: tuple[float, str, int] | None = None
        """The newest delivery order among the rows ever kept."""
        self.highest: tuple[int, int, int] | None = None


KeyIdentity = tuple[str | None, str | None, str | None, str | None]


@dataclass(slots=True)
class _Nonmonotonic:
    keys: dict[KeyIdentity, _KeyDeliveries] = field(default_factory=dict)
    queue: deque[tuple[float, KeyIdentity, int]] = field(default_factory=deque)
    """(time, key, seq) of each row, in the order they came."""
    names: dict[KeyIdentity, KeyIdentity] = field(default_factory=dict)
    """Each key's one tuple, which the rows' entries in ``queue`` share."""

    def check(self, deliveries: Sequence[Event], found: list[Anomaly]) -> None:
        fresh: dict[KeyIdentity, list[_Delivery]] = {}
        firsts: set[tuple[KeyIdentity, int]] = set()
        for event in deliveries:
            get = event.get
            key, producer, seq = get("key"), get("producer"), get("producer_seq")
            if key is None or producer is None or seq is None or get("ordered") is False:
                continue
            given = (get("group"), get("topic"), producer, key)
            identity = self.names.setdefault(given, given)
            known = self.keys.get(identity)
            if (identity, seq) in firsts or (known is not None and seq in known.rows):
                continue  # a re-delivery: a duplicate, not a reordering
            firsts.add((identity, seq))
            time = event["time"]
            row = _Delivery(
                (time, event["sidecar"], event["seq"]),
                seq,
                get("partition"),
                get("offset"),
                get("generation"),
                get("instance"),
            )
            rows = fresh.get(identity)
            if rows is None:
                fresh[identity] = [row]
            else:
                rows.append(row)
            self.queue.append((time, identity, seq))
        for identity, rows in fresh.items():
            state = self.keys.get(identity)
            if state is None:
                state = self.keys[identity] = _KeyDeliveries()
            if state.last is None or rows[0].order > state.last:
                self._append(identity, state, rows, found)
            else:
                self._recheck(identity, state, rows, found)

    def _append(
        self,
        identity: KeyIdentity,
        state: _KeyDeliveries,
        rows: list[_Delivery],
        found: list[Anomaly],
    ) -> None:
        """The common case: every new row comes after every row kept."""
        highest = state.highest
        for row in rows:
            if highest is not None and row.seq < highest[0]:
                row.flagged = True
                found.append(_late(identity, row, highest))
            mark = row.highest()
            if highest is None or mark > highest:
                highest = mark
            state.rows[row.seq] = row
        state.highest = highest
        state.last = rows[-1].order

    def _recheck(
        self,
        identity: KeyIdentity,
        state: _KeyDeliveries,
        rows: list[_Delivery],
        found: list[Anomaly],
    ) -> None:
        """A new row comes before a kept one: the key's rows again, in delivery order."""
        new = {id(row) for row in rows}
        for row in rows:
            state.rows[row.seq] = row
        highest: tuple[int, int, int] | None = None
        for row in sorted(state.rows.values(), key=lambda r: r.order):
            if highest is not None and row.seq < highest[0]:
                if id(row) in new or not row.flagged:
                    found.append(_late(identity, row, highest))
                row.flagged = True
            mark = row.highest()
            if highest is None or mark > highest:
                highest = mark
        state.highest = highest
        last = max(row.order for row in rows)
        state.last = last if state.last is None else max(state.last, last)

    def sweep(self, cutoff: float) -> None:
        """Rows older than ``cutoff`` dropped, except each key's highest seq."""
        queue = self.queue
        while queue and queue[0][0] < cutoff:
            _, identity, seq = queue.popleft()
            state = self.keys[identity]
            row = state.rows.get(seq)
            if (
                row is not None
                and row.order[0] < cutoff
                and (state.highest is None or seq != state.highest[0])
            ):
                del state.rows[seq]

    def size(self) -> int:
        return sum(len(state.rows) for state in self.keys.values())


def _late(identity: KeyIdentity, row: _Delivery, before: tuple[int, int, int]) -> Anomaly:
    group, topic, producer, key = identity
    detail = (
        f"seq {row.seq} (partition {_d(row.partition)} offset {_d(row.offset)}) delivered "
        f"after seq {before[0]} (partition {before[1]} offset {before[2]})"
    )
    return _anomaly(
        kinds.NONMONOTONIC,
        detail,
        {
            "topic": topic,
            "group": group,
            "producer": producer,
            "key": key,
            "partition": row.partition,
            "offset": row.offset,
            "generation": row.generation,
            "producer_seq": row.seq,
            "time": row.order[0],
            "sidecar": row.order[1],
            "instance": row.instance,
        },
    )


# written_across_barrier ---------------------------------------------------------------


class _Record:
    """One record of a partition, however many events name it."""

    __slots__ = ("flagged", "key", "producer", "producer_seq", "time")

    def __init__(
        self, key: str | None, producer: str | None, producer_seq: int | None, time: float
    ) -> None:
        self.key = key
        self.producer = producer
        self.producer_seq = producer_seq
        self.time = time
        self.flagged = False


class _Generation:
    """One generation's records in one partition, by offset."""

    __slots__ = ("dropped", "offsets", "rows")

    def __init__(self) -> None:
        self.rows: dict[int, _Record] = {}
        self.offsets: list[int] = []
        """Sorted; also holds offsets whose rows were dropped, until there are as many
        of those as rows."""
        self.dropped = 0

    def add(self, offset: int, record: _Record) -> None:
        self.rows[offset] = record
        bisect.insort(self.offsets, offset)

    def drop(self, offset: int) -> None:
        del self.rows[offset]
        self.dropped += 1
        if self.dropped > len(self.rows):
            self.offsets = [o for o in self.offsets if o in self.rows]
            self.dropped = 0

    def lowest(self) -> int:
        return next(o for o in self.offsets if o in self.rows)

    def highest(self) -> int:
        return next(o for o in reversed(self.offsets) if o in self.rows)

    def below(self, offset: int) -> int | None:
        """The highest offset of this generation below ``offset``."""
        at = bisect.bisect_left(self.offsets, offset)
        while at:
            at -= 1
            if self.offsets[at] in self.rows:
                return self.offsets[at]
        return None

    def above(self, offset: int) -> list[int]:
        """Its offsets above ``offset``."""
        at = bisect.bisect_right(self.offsets, offset)
        return [o for o in self.offsets[at:] if o in self.rows]


PartitionIdentity = tuple[str | None, int]


@dataclass(slots=True)
class _Barrier:
    partitions: dict[PartitionIdentity, dict[int, _Generation]] = field(default_factory=dict)
    queue: deque[tuple[float, PartitionIdentity, int, int]] = field(default_factory=deque)
    """(time, partition, generation, offset) of each record, in the order they came."""
    names: dict[PartitionIdentity, PartitionIdentity] = field(default_factory=dict)
    """Each partition's one tuple, which the entries in ``queue`` share."""

    def check(self, named: Iterable[Event], found: list[Anomaly]) -> None:
        """``named``: the produce_acked and delivered events."""
        fresh: dict[PartitionIdentity, list[tuple[int, int]]] = {}
        for event in named:
            get = event.get
            generation, partition, offset = get("generation"), get("partition"), get("offset")
            if generation is None or partition is None or offset is None:
                continue
            given = (get("topic"), partition)
            identity = self.names.setdefault(given, given)
            generations = self.partitions.get(identity)
            if generations is None:
                generations = self.partitions[identity] = {}
            records = generations.get(generation)
            if records is None:
                records = generations[generation] = _Generation()
            if offset in records.rows:
                continue
            time = event["time"]
            records.add(offset, _Record(get("key"), get("producer"), get("producer_seq"), time))
            self.queue.append((time, identity, generation, offset))
            fresh.setdefault(identity, []).append((generation, offset))
        for identity, rows in fresh.items():
            generations = self.partitions[identity]
            order = sorted(generations)
            # The highest offset of each generation and every older one: a new record
            # below it may show an older record to be across a barrier.
            reach = list(itertools.accumulate((generations[g].highest() for g in order), max))
            new = set(rows)
            hits: list[tuple[int, int]] = []
            for generation, offset in rows:
                # The new record, above a newer generation's record.
                if generation < order[-1]:
                    hits.append((generation, offset))
                # Kept records of older generations above the new record.
                older = bisect.bisect_left(order, generation)
                if not older or reach[older - 1] <= offset:
                    continue
                for earlier in order[:older]:
                    hits.extend((earlier, above) for above in generations[earlier].above(offset))
            for generation, offset in sorted(set(hits)):
                record = generations[generation].rows[offset]
                newer = _newer_below(generations, order, generation, offset)
                if newer is None:
                    continue
                if (generation, offset) in new or not record.flagged:
                    found.append(_across(identity, generation, offset, record, newer))
                record.flagged = True

    def sweep(self, cutoff: float) -> None:
        """Records older than ``cutoff`` dropped, except the lowest and highest offset of
        each (partition, generation)."""
        queue = self.queue
        while queue and queue[0][0] < cutoff:
            _, identity, generation, offset = queue.popleft()
            records = self.partitions[identity][generation]
            record = records.rows.get(offset)
            if (
                record is not None
                and record.time < cutoff
                and offset != records.lowest()
                and offset != records.highest()
            ):
                records.drop(offset)

    def size(self) -> int:
        return sum(
            len(records.rows)
            for generations in self.partitions.values()
            for records in generations.values()
        )


def _newer_below(
    generations: Mapping[int, _Generation], order: Sequence[int], generation: int, offset: int
) -> tuple[int, int] | None:
    """The newest generation with a record below ``offset``, and its highest offset
    there (``checks.with_newer_below``'s ``_newer``), when it is newer than
    ``generation``."""
    for newer in reversed(order):
        if newer <= generation:
            return None
        below = generations[newer].below(offset)
        if below is not None:
            return (newer, below)
    return None


def _across(
    identity: PartitionIdentity,
    generation: int,
    offset: int,
    record: _Record,
    newer: tuple[int, int],
) -> Anomaly:
    topic, partition = identity
    detail = (
        f"generation {generation} at offset {offset}, above generation {newer[0]} "
        f"at offset {newer[1]}"
    )
    return _anomaly(
        kinds.WRITTEN_ACROSS_BARRIER,
        detail,
        {
            "topic": topic,
            "key": record.key,
            "producer": record.producer,
            "producer_seq": record.producer_seq,
            "partition": partition,
            "offset": offset,
            "generation": generation,
            "time": record.time,
        },
    )


# lost -----------------------------------------------------------------------------------


class _Ack:
    __slots__ = ("acked_at", "generation", "key", "producer", "producer_seq", "sidecar")

    def __init__(self, event: Mapping[str, Any]) -> None:
        self.key: str | None = event.get("key")
        self.generation: int | None = event.get("generation")
        self.producer: str | None = event.get("producer")
        self.producer_seq: int | None = event.get("producer_seq")
        self.sidecar: str = event["sidecar"]
        self.acked_at: float = event["time"]


class _Progress:
    """One group's progress in one partition (``checks.partition_progress``)."""

    __slots__ = ("committed_end", "delivered_end", "first_delivered", "first_time")

    def __init__(self) -> None:
        self.first_delivered: int | None = None
        self.delivered_end: int | None = None
        self.first_time: float | None = None
        self.committed_end: int | None = None

    def read_to(self) -> int:
        return max(self.delivered_end or 0, self.committed_end or 0)


Position = tuple[str | None, int, int]
GroupPartition = tuple[str | None, str | None, int]


@dataclass(slots=True)
class _Lost:
    """Whether a group skipped a record can be told only once no delivery of it can still
    come: records are judged once the cutoff (the watermark less the horizon) passes
    their acknowledgement, against the groups' progress then; a group that had not read
    past a record by then never judges it (the batch job counts it as unseen, or lost
    later)."""

    acks: dict[Position, _Ack] = field(default_factory=dict)
    """Acknowledged records not judged yet."""
    due: list[tuple[float, Position]] = field(default_factory=list)
    """``acks`` as a heap by acknowledgement time."""
    progress: dict[GroupPartition, _Progress] = field(default_factory=dict)
    groups: dict[tuple[str | None, int], set[str | None]] = field(default_factory=dict)
    """The groups with progress in each (topic, partition)."""
    started: dict[tuple[str | None, str | None], float] = field(default_factory=dict)
    """Each (group, topic)'s first delivery."""
    seen: dict[GroupPartition, dict[int, float]] = field(default_factory=dict)
    """Deliveries (offset: time) an acknowledged record not judged yet may need."""
    queue: deque[tuple[float, GroupPartition, int]] = field(default_factory=deque)
    """(time, group partition, offset) of each of ``seen``, in the order they came."""
    names: dict[GroupPartition, GroupPartition] = field(default_factory=dict)
    """Each group partition's one tuple, which the entries in ``queue`` share."""

    def check(
        self,
        acks: Sequence[Event],
        deliveries: Sequence[Event],
        commits: Sequence[Event],
        cutoff: float | None,
        found: list[Anomaly],
    ) -> None:
        for event in acks:
            partition, offset = event.get("partition"), event.get("offset")
            if partition is not None and offset is not None:
                position = (event.get("topic"), partition, offset)
                if position not in self.acks:
                    ack = self.acks[position] = _Ack(event)
                    heapq.heappush(self.due, (ack.acked_at, position))
        for event in deliveries:
            partition, offset = event.get("partition"), event.get("offset")
            if partition is not None and offset is not None:
                group, topic = event.get("group"), event.get("topic")
                given = (group, topic, partition)
                at = self.names.setdefault(given, given)
                progress = self.progress.get(at) or self._progress(at)
                time = event["time"]
                if progress.first_delivered is None or offset < progress.first_delivered:
                    progress.first_delivered = offset
                if progress.delivered_end is None or offset + 1 > progress.delivered_end:
                    progress.delivered_end = offset + 1
                if progress.first_time is None or time < progress.first_time:
                    progress.first_time = time
                if time < self.started.get((group, topic), math.inf):
                    self.started[(group, topic)] = time
                offsets = self.seen.setdefault(at, {})
                if offset not in offsets:
                    offsets[offset] = time
                    self.queue.append((time, at, offset))
        for event in commits:
            partition, offset = event.get("partition"), event.get("offset")
            if partition is not None and offset is not None:
                progress = self._progress((event.get("group"), event.get("topic"), partition))
                if progress.committed_end is None or offset > progress.committed_end:
                    progress.committed_end = offset
        if cutoff is None:
            return
        while self.due and self.due[0][0] < cutoff:
            _, position = heapq.heappop(self.due)
            self._judge(position, self.acks.pop(position), found)
            # Its deliveries are needed no more, once older than the cutoff.
            topic, partition, offset = position
            for group in self.groups.get((topic, partition), ()):
                delivered = self.seen.get((group, topic, partition))
                if delivered is not None and delivered.get(offset, cutoff) < cutoff:
                    del delivered[offset]

    def _progress(self, at: GroupPartition) -> _Progress:
        progress = self.progress.get(at)
        if progress is None:
            progress = self.progress[at] = _Progress()
            group, topic, partition = at
            self.groups.setdefault((topic, partition), set()).add(group)
        return progress

    def _judge(self, position: Position, ack: _Ack, found: list[Anomaly]) -> None:
        """``checks.skipped`` for one record."""
        topic, partition, offset = position
        for group in sorted(self.groups.get((topic, partition), ()), key=str):
            at = (group, topic, partition)
            progress = self.progress[at]
            read_to = progress.read_to()
            if offset >= read_to:
                continue
            started = self.started.get((group, topic))
            reached = (
                progress.first_delivered is not None and offset >= progress.first_delivered
            ) or (started is not None and ack.acked_at >= started)
            if not reached or offset in self.seen.get(at, {}):
                continue
            detail = (
                f"acknowledged at offset {offset}; the group read partition {partition} "
                f"up to offset {read_to}"
            )
            found.append(
                _anomaly(
                    kinds.LOST,
                    detail,
                    {
                        "topic": topic,
                        "group": group,
                        "producer": ack.producer,
                        "key": ack.key,
                        "partition": partition,
                        "offset": offset,
                        "generation": ack.generation,
                        "producer_seq": ack.producer_seq,
                        "time": ack.acked_at,
                        "sidecar": ack.sidecar,
                    },
                )
            )

    def sweep(self, cutoff: float) -> None:
        """Deliveries kept while their record waits to be judged, or while its
        acknowledgement may still come (newer than ``cutoff``)."""
        queue = self.queue
        while queue and queue[0][0] < cutoff:
            _, at, offset = queue.popleft()
            _, topic, partition = at
            offsets = self.seen[at]
            if (topic, partition, offset) not in self.acks and offsets.get(offset, cutoff) < cutoff:
                del offsets[offset]

    def size(self) -> int:
        return len(self.acks) + sum(len(offsets) for offsets in self.seen.values())


# The single-event checks ------------------------------------------------------------


@dataclass(slots=True)
class _SingleEvent:
    """``gate_evidence``, ``unaudited_delivery`` and ``consumer_truncated``: each about
    one event. The events reported are remembered (until the cutoff passes them), so an
    event the topic holds twice is reported once."""

    reported: set[tuple[str, int, float, str]] = field(default_factory=set)
    queue: deque[tuple[float, tuple[str, int, float, str]]] = field(default_factory=deque)

    def check(self, events: Iterable[Event], found: list[Anomaly]) -> None:
        for event in events:
            before = len(found)
            _single_event(event, found)
            if len(found) == before:
                continue
            identity = (event["sidecar"], event["seq"], event["time"], event["type"])
            if identity in self.reported:
                del found[before:]
            else:
                self.reported.add(identity)
                self.queue.append((event["time"], identity))

    def sweep(self, cutoff: float) -> None:
        queue = self.queue
        while queue and queue[0][0] < cutoff:
            self.reported.discard(queue.popleft()[1])


def _single_event(event: Event, found: list[Anomaly]) -> None:
    """The anomalies of one event."""
    kind = event["type"]
    if kind == "gate_opened":
        for evidence in event.get("evidence") or ():
            boundary = evidence.get("boundary")
            if boundary is None:
                continue
            committed = evidence.get("committed")
            log_start = evidence.get("log_start")
            mode = evidence.get("mode")
            blocked = (
                (-1 if committed is None else committed) < boundary
                and (0 if log_start is None else log_start) < boundary
                and (mode or "") != "removed"
            )
            if blocked:
                detail = (
                    f"source partition {_d(evidence.get('source'))}: committed "
                    f"{'none' if committed is None else committed} < boundary {boundary}, "
                    f"log start {'unknown' if log_start is None else log_start}, "
                    f"mode {'unknown' if mode is None else mode}"
                )
                found.append(_anomaly(kinds.GATE_EVIDENCE, detail, event))
    elif kind == "delivered" and event.get("producer") is None:
        detail = "no ordered.* headers: written by a producer that bypassed the sidecars"
        found.append(_anomaly(kinds.UNAUDITED_DELIVERY, detail, event))
    elif kind == "consumer_truncated":
        resume_at = event.get("resume_at")
        detail = (
            f"leader epoch {_d(event.get('leader_epoch'))} ends at "
            f"{'an unknown offset' if resume_at is None else resume_at}, below the "
            f"position {_d(event.get('position'))}: {_d(event.get('lost'))} offset(s) "
            "read are no longer in the log (an unclean leader election); read again "
            "from there"
        )
        found.append(
            _anomaly(
                kinds.CONSUMER_TRUNCATED,
                detail,
                {**event, "offset": 0 if resume_at is None else resume_at},
            )
        )


# The state and a batch ----------------------------------------------------------------


@dataclass(slots=True)
class LiveState:
    """Everything the checks remember from one batch to the next."""

    newest: float | None = None
    """The newest event time of every batch so far (the watermark follows from it)."""
    nonmonotonic: _Nonmonotonic = field(default_factory=_Nonmonotonic)
    barrier: _Barrier = field(default_factory=_Barrier)
    lost: _Lost = field(default_factory=_Lost)
    single_event: _SingleEvent = field(default_factory=_SingleEvent)

    def rows(self) -> dict[str, int]:
        """How many rows each check keeps (deliveries, records, acks and deliveries)."""
        return {
            "deliveries": self.nonmonotonic.size(),
            "records": self.barrier.size(),
            "acknowledgements": self.lost.size(),
        }


def check_batch(state: LiveState, events: Sequence[Event], cutoff: float | None) -> list[Anomaly]:
    """Every live check of ``events`` (``parse_events``'s: conformed, in delivery order)
    against ``state``, which becomes the state for the next batch; ``cutoff`` as in the
    module's docstring. Also moves ``state.newest`` on."""
    found: list[Anomaly] = []
    by_type: dict[str, list[Event]] = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event)
    acks = by_type.get("produce_acked", [])
    deliveries = by_type.get("delivered", [])
    state.nonmonotonic.check(deliveries, found)
    state.barrier.check(itertools.chain(acks, deliveries), found)
    state.lost.check(acks, deliveries, by_type.get("committed", []), cutoff, found)
    state.single_event.check(
        itertools.chain(
            by_type.get("gate_opened", ()),
            (event for event in deliveries if event.get("producer") is None),
            by_type.get("consumer_truncated", ()),
        ),
        found,
    )
    if events:
        newest = max(event["time"] for event in events)
        state.newest = newest if state.newest is None else max(state.newest, newest)
    if cutoff is not None:
        state.nonmonotonic.sweep(cutoff)
        state.barrier.sweep(cutoff)
        state.lost.sweep(cutoff)
        state.single_event.sweep(cutoff)
    return found
