"""The checks of a chaos run: pure functions of its history and of the topics as stored.

Each check returns a ``CheckResult``: facts for the report and violations, each a line
of evidence. A check passes when it has no violation.

1. ``order``: per group, every (producer, key) delivered in produce order: a record is
   delivered as the key's newest only once every acknowledged record before it was
   delivered. Duplicates (at-least-once) are allowed and counted.
2. ``liveness``: every acknowledged record reached every group within the bound after
   the last fault ended.
3. ``handoff``: per group, for every change k and every source q whose keys moved
   (``expectations.RevocationDue``): exactly one ``keys_revoked(q, k)``, received before
   the first gated record of a destination that waits on q (told again only while the
   group had not committed q past the boundary, or when a fault between the two
   tellings cut the first answer's way to ZooKeeper: ``_answer_lost_to``); and
   ``keys_assigned(p, g)`` received by the instance that delivered p's first gated
   record of generation g, before it.
4. ``stale``: produces naming an older generation are fenced and nothing of them is
   written or delivered.
5. ``barrier``: read committed, no record lies in a generation other than the one it
   was routed with (a zombie's late write lies in a newer one), every keyed record is
   where linear hashing put it, no acknowledgement names a generation older than the
   one its offset lies in, and no acknowledged record is missing.
6. ``log``: the sidecars' generation log at the end is the full log (every generation
   the harness saw) folded at its first generation, and folded only where every
   boundary of that generation lies at or below its partition's log start. The other
   checks use the full log, and the records the harness deleted (``trim_every_s``).
7. ``compaction``: on the compacted topic, after compaction, a key's superseded value
   is readable outside the key's newest partition only where the consumer gate orders
   it before the newer value, and always with a relocation tombstone after it.
8. ``changes``: no change lock outlives any change (a leaked lock), and after the
   faults one more change of every topic is done.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ordered_dev.harness.chaos.expectations import LogWaits, RevocationDue
from ordered_dev.harness.chaos.history import (
    Delivery,
    FaultRecord,
    Handoff,
    History,
    RecordId,
)
from sidecar.core.compaction import compact
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.placement import RELOCATION_HEADER, record_stamp
from sidecar.core.routing import partition_for_key

ROLL_HEADER = "chaos.roll"
"""Marks the records the harness writes after the run to roll the compacted topic's
segments (so that compaction can reach the last records); not the sidecar's."""
KEYS_REVOKED = "keys_revoked"
KEYS_ASSIGNED = "keys_assigned"


@dataclass(frozen=True, slots=True)
class StoredRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Mapping[str, bytes | None]
    timestamp_ms: int


@dataclass
class TopicSnapshot:
    """One managed topic at the end of the run, read with ``read_committed``."""

    name: str
    compacted: bool
    log: GenerationLog
    modes: tuple[PartitionMode, ...]
    log_start: dict[int, int]
    log_end: dict[int, int]
    records: list[StoredRecord]
    cleaned_up_to: dict[int, int] = field(default_factory=dict)
    """Compacted topic: per partition, the offset the log cleaner has cleaned up to
    (the smallest over the replicas)."""
    stored_log: GenerationLog | None = None
    """The log the sidecars keep at the end, folded if compaction folded it; ``log`` is
    the full one (``KeptLog``), and ``records`` include what the harness deleted."""
    fold_notes: list[str] = field(default_factory=list)
    """How far the log could have been folded at the end, and what stopped it."""

    def mode(self, partition: int) -> PartitionMode:
        if partition < len(self.modes):
            return self.modes[partition]
        return PartitionMode.REMOVED


@dataclass(frozen=True, slots=True)
class RunTimes:
    """When things ended, in seconds since the run began."""

    last_fault_end: float
    producers_stopped: float
    """The producers stop just after the faults and one more change of each topic."""
    liveness_evidence: Mapping[str, str] = field(default_factory=dict)
    """Per group still missing records at the bound: what the sidecars said then."""


@dataclass
class CheckResult:
    key: str
    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Things worth reading that are not violations (excused duplicates, ...)."""

    @property
    def passed(self) -> bool:
        return not self.violations


def parse_value(value: bytes | None) -> RecordId | int | None:
    """A producer's record id, a stale probe's number (int), or None (anything else)."""
    if not value:
        return None
    try:
        document = json.loads(value)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    if "stale" in document:
        return int(document["stale"])
    try:
        return (int(document["producer"]), str(document["key"]), int(document["seq"]))
    except (KeyError, TypeError, ValueError):
        return None


def stored_key(key: str) -> bytes:
    """The bytes a key sent in the JSON embedded format is stored as (the sidecar writes
    the key's JSON text: ``"p0-k1"`` with its quotes)."""
    return json.dumps(key, separators=(",", ":"), ensure_ascii=False).encode()


def compacted_away(history: History, snapshot: TopicSnapshot) -> set[RecordId]:
    """Acknowledged records of a compacted topic that are no longer stored because a
    later record of the same key in the same partition superseded them."""
    if not snapshot.compacted:
        return set()
    stored = {(r.partition, r.offset) for r in snapshot.records}
    latest: dict[tuple[int, bytes], int] = {}
    for record in snapshot.records:
        if record.key is not None:
            slot = (record.partition, record.key)
            latest[slot] = max(latest.get(slot, -1), record.offset)
    gone = set()
    for acked in history.acked.values():
        if acked.topic != snapshot.name or (acked.partition, acked.offset) in stored:
            continue
        if latest.get((acked.partition, stored_key(acked.record[1])), -1) > acked.offset:
            gone.add(acked.record)
    return gone


def _where(delivery: Delivery | None) -> str:
    if delivery is None:
        return "never"
    return (
        f"{delivery.topic}[{delivery.partition}]@{delivery.offset} by {delivery.incarnation} "
        f"at {delivery.at:.1f} s"
    )


# 1. Order --------------------------------------------------------------------------------


def check_order(history: History) -> CheckResult:
    result = CheckResult("order", "Per-(producer, key) order in each group")
    for group in history.groups:
        by_key: dict[tuple[int, str], list[Delivery]] = defaultdict(list)
        for delivery in history.deliveries:
            if delivery.group == group and delivery.record is not None:
                by_key[delivery.record[:2]].append(delivery)
        first_seen: dict[RecordId, Delivery] = {}
        for delivery in history.deliveries:
            if delivery.group == group and delivery.record is not None:
                first_seen.setdefault(delivery.record, delivery)
        duplicates = 0
        for (producer, key), deliveries in sorted(by_key.items()):
            highest = -1
            for delivery in deliveries:
                assert delivery.record is not None
                sequence = delivery.record[2]
                if sequence <= highest:
                    duplicates += 1
                    continue
                skipped = [
                    s
                    for s in range(highest + 1, sequence)
                    if (producer, key, s) in history.acked
                    and (producer, key, s) not in history.compacted_away
                    and (
                        (producer, key, s) not in first_seen
                        or first_seen[(producer, key, s)].order > delivery.order
                    )
                ]
                if skipped:
                    missing = (producer, key, skipped[0])
                    acked = history.acked[missing]
                    result.violations.append(
                        f"{group}: {producer}/{key} seq {sequence} ({_where(delivery)}) "
                        f"delivered before acknowledged seq {skipped[0]} (placed "
                        f"{acked.topic}[{acked.partition}]@{acked.offset}, generation "
                        f"{acked.generation}; delivered {_where(first_seen.get(missing))})"
                    )
                highest = sequence
        total = sum(1 for d in history.deliveries if d.group == group and d.record is not None)
        result.facts.append((f"{group}: deliveries / duplicates", f"{total:,} / {duplicates:,}"))
    return result


# 2. Liveness -----------------------------------------------------------------------------


def full_delivery_at(history: History, group: str) -> float | None:
    """When the group had received every acknowledged record (None: never)."""
    first: dict[RecordId, float] = {}
    for delivery in history.deliveries:
        if delivery.group == group and delivery.record is not None:
            first.setdefault(delivery.record, delivery.at)
    latest = 0.0
    for record in history.acked:
        if record in history.compacted_away:
            continue
        at = first.get(record)
        if at is None:
            return None
        latest = max(latest, at)
    return latest


def check_liveness(history: History, times: RunTimes, bound_s: float) -> CheckResult:
    """The bound counts from the end of the last fault or, if later, from the moment the
    producers stopped (a record acknowledged after the last fault has the bound too)."""
    result = CheckResult(
        "liveness", f"Every acknowledged record delivered to every group within {bound_s:g} s"
    )
    quiet = max(times.last_fault_end, times.producers_stopped)
    result.facts.append(("last fault ended", f"{times.last_fault_end:.1f} s"))
    result.facts.append(("producers stopped", f"{times.producers_stopped:.1f} s"))
    result.facts.append(
        (
            "acknowledged records compacted away before delivery (not required)",
            f"{len(history.compacted_away):,}",
        )
    )
    for group in history.groups:
        at = full_delivery_at(history, group)
        if at is None:
            missing = [
                r
                for r in history.acked
                if r not in history.seen[group] and r not in history.compacted_away
            ]
            per_partition: dict[tuple[str, int], int] = {}
            for record in missing:
                acked = history.acked[record]
                where = (acked.topic, acked.partition)
                per_partition[where] = min(per_partition.get(where, acked.offset), acked.offset)
            first_missing = ", ".join(
                f"{t}[{p}]@{o}" for (t, p), o in sorted(per_partition.items())
            )
            result.facts.append((f"{group}: full delivery", "never"))
            result.violations.append(
                f"{group}: {len(missing):,} acknowledged records never delivered; first "
                f"missing offset per partition: {first_missing}; at the bound: "
                f"{times.liveness_evidence.get(group, '-')}"
            )
            continue
        took = max(0.0, at - quiet)
        result.facts.append(
            (
                f"{group}: full delivery after the last fault / after the producers stopped",
                f"{max(0.0, at - times.last_fault_end):.1f} s / "
                f"{max(0.0, at - times.producers_stopped):.1f} s",
            )
        )
        if took > bound_s:
            result.violations.append(
                f"{group}: full delivery {took:.1f} s after the faults and the load ended (bound "
                f"{bound_s:g} s); at the bound: {times.liveness_evidence.get(group, '-')}"
            )
    return result


# 3. Hand-off -----------------------------------------------------------------------------


def _committed_past(
    history: History, group: str, topic: str, partition: int, boundary: int, before: int
) -> tuple[float, int] | None:
    """The first sample of the group's committed offset of ``partition`` at or past
    ``boundary`` taken before the observation ``before`` (by order), if any."""
    for order, at, offset in history.commits.get((group, topic, partition), []):
        if order < before and offset >= boundary:
            return at, offset
    return None


def _answer_lost_to(history: History, earlier: Handoff, later: Handoff) -> FaultRecord | None:
    """A fault that explains a keys_revoked told again to ``later`` after ``earlier``'s
    app had it, if one lies between the two tellings.

    The group records an app's answer in ZooKeeper after the app gave it, so a sidecar
    killed or paused past its session between the two (or ZooKeeper paused meanwhile)
    loses the record and the partition's next owner tells it again; and a response the
    later sidecar computed just before it was paused reaches its app only after the
    pause. Nothing else may tell a hand-off twice (DESIGN, the hand-off contract).
    """
    sidecars = {
        history.incarnations[h.incarnation].sidecar
        for h in (earlier, later)
        if h.incarnation in history.incarnations
    }
    for fault in history.faults:
        if fault.ended < earlier.at - 1.0 or fault.started > later.at:
            continue
        if fault.kind == "zookeeper_pause":
            return fault
        if fault.kind in ("sidecar_kill", "sidecar_pause") and any(
            sidecar in fault.detail for sidecar in sidecars
        ):
            return fault
    return None


def _reached(history: History, group: str, topic: str, partition: int, boundary: int) -> str:
    """When the group's committed offset of ``partition`` was first seen at or past
    ``boundary``."""
    for _, at, offset in history.commits.get((group, topic, partition), []):
        if offset >= boundary:
            return f"the group's commit of {partition} was seen at {offset} from {at:.1f} s"
    return f"the group's commit of {partition} was never seen at {boundary} or beyond"


def check_handoff(history: History, snapshots: Sequence[TopicSnapshot]) -> CheckResult:
    result = CheckResult("handoff", "Key hand-off: keys_revoked and keys_assigned")
    for snapshot in snapshots:
        waits = LogWaits(snapshot.log)
        due = waits.revocations_due()
        gated = set(waits.gated_destinations())
        for group in history.groups:
            _handoff_of_group(result, history, snapshot, waits, due, gated, group)
    return result


def _handoff_of_group(
    result: CheckResult,
    history: History,
    snapshot: TopicSnapshot,
    waits: LogWaits,
    due: Sequence[RevocationDue],
    gated: set[tuple[int, int]],
    group: str,
) -> None:
    topic, log = snapshot.name, snapshot.log
    deliveries = [d for d in history.deliveries if d.group == group and d.topic == topic]
    lowest_delivered: dict[int, int] = {}
    first_of: dict[tuple[int, int], Delivery] = {}
    first_by_incarnation: dict[tuple[str, int, int], Delivery] = {}
    for delivery in deliveries:
        partition = delivery.partition
        lowest_delivered[partition] = min(
            lowest_delivered.get(partition, delivery.offset), delivery.offset
        )
        try:
            generation = log.generation_of(partition, delivery.offset)
        except ValueError:
            result.violations.append(
                f"{group}: delivered {_where(delivery)} lies in no generation of the log"
            )
            continue
        node = (partition, generation)
        first_of.setdefault(node, delivery)
        first_by_incarnation.setdefault((delivery.incarnation, *node), delivery)
    handoffs = [h for h in history.handoffs if h.group == group and h.topic == topic]
    revoked: dict[tuple[int, int], list[Handoff]] = defaultdict(list)
    assigned: dict[tuple[str, int, int], list[Handoff]] = defaultdict(list)
    for handoff in handoffs:
        if handoff.kind == KEYS_REVOKED:
            revoked[(handoff.partition, handoff.generation)].append(handoff)
        elif handoff.kind == KEYS_ASSIGNED:
            assigned[(handoff.incarnation, handoff.partition, handoff.generation)].append(handoff)

    required = exempt = told_once = excused = 0
    for item in due:
        q, change, boundary = item.partition, item.change, item.boundary
        delivered_below = lowest_delivered.get(q, boundary) < boundary
        gone = snapshot.log_start.get(q, 0) >= boundary or snapshot.mode(q) is PartitionMode.REMOVED
        if not delivered_below and gone:
            exempt += 1  # removed (or truncated) without this group consuming it
            continue
        required += 1
        told = sorted(revoked.get((q, change), []), key=lambda h: h.order)
        destinations = sorted(item.destinations)
        firsts = [(node, first_of.get(node)) for node in destinations]
        where_to = _destinations(destinations)
        if not told:
            released = [f"{p}/{g}: {_where(d)}" for (p, g), d in firsts if d is not None]
            result.violations.append(
                f"{group}: no keys_revoked({topic}[{q}], change {change}) (boundary {boundary});"
                f" keys moved to {where_to}; {_reached(history, group, topic, q, boundary)}; "
                f"gated records released: {'; '.join(released[:4]) or 'none'}"
                + (f" and {len(released) - 4} more" if len(released) > 4 else "")
            )
            continue
        if len(told) == 1:
            told_once += 1
        for earlier, later in itertools.pairwise(told):
            # A repeat is due only while the group has not committed q past the boundary
            # (the owner changed before its commit): once it has, nobody holds q's keys of
            # before the boundary any more, and the first telling was the one.
            past = _committed_past(history, group, topic, q, boundary, later.order)
            if later.incarnation == earlier.incarnation:
                result.violations.append(
                    f"{group}: keys_revoked({topic}[{q}], change {change}, boundary {boundary}) "
                    f"told twice to {later.incarnation}, at {earlier.at:.1f} s and at "
                    f"{later.at:.1f} s"
                )
            elif past is not None and (cause := _answer_lost_to(history, earlier, later)):
                excused += 1
                result.notes.append(
                    f"{group}: keys_revoked({topic}[{q}], change {change}) told again to "
                    f"{later.incarnation} at {later.at:.1f} s (to {earlier.incarnation} at "
                    f"{earlier.at:.1f} s before; its answer's record lost to {cause.kind} "
                    f"{cause.target}, {cause.started:.1f}-{cause.ended:.1f} s)"
                )
            elif past is not None:
                result.violations.append(
                    f"{group}: keys_revoked({topic}[{q}], change {change}, boundary {boundary}) "
                    f"told again to {later.incarnation} at {later.at:.1f} s, although the group "
                    f"had committed {q} at {past[1]} by {past[0]:.1f} s (first told to "
                    f"{earlier.incarnation} at {earlier.at:.1f} s)"
                )
            else:
                excused += 1
                result.notes.append(
                    f"{group}: keys_revoked({topic}[{q}], change {change}) told again to "
                    f"{later.incarnation} at {later.at:.1f} s (to {earlier.incarnation} at "
                    f"{earlier.at:.1f} s before; no commit at {boundary} or beyond seen yet)"
                )
        first_told = told[0]
        early = [
            (node, first)
            for node, first in firsts
            if first is not None and first.order < first_told.order
        ]
        if early:
            (p, g), earliest = min(early, key=lambda item: item[1].order)
            result.violations.append(
                f"{group}: keys_revoked({topic}[{q}], change {change}, boundary {boundary}) "
                f"came late, to {first_told.incarnation} at {first_told.at:.1f} s: the first "
                f"gated records of {len(early)} destinations waiting on it were released "
                f"before, the first of {p} (generation {g}) {_where(earliest)}; "
                f"{_reached(history, group, topic, q, boundary)}"
            )

    assigned_ok = told_by_other = 0
    for node, delivery in sorted(first_of.items()):
        if node not in gated:
            continue
        p, g = node
        told = [
            h for h in assigned.get((delivery.incarnation, p, g), []) if h.order < delivery.order
        ]
        if told:
            assigned_ok += 1
            continue
        elsewhere = [h for (i, pp, gg), hs in assigned.items() if (pp, gg) == node for h in hs]
        result.violations.append(
            f"{group}: first gated record of {topic}[{p}] (generation {g}) released "
            f"({_where(delivery)}) without keys_assigned({p}, {g}) to that instance before it"
            + (
                f" (told to {', '.join(sorted({h.incarnation for h in elsewhere}))})"
                if elsewhere
                else ""
            )
        )
    for (incarnation, p, g), delivery in sorted(first_by_incarnation.items()):
        if (p, g) not in gated or first_of.get((p, g)) is delivery:
            continue
        if not any(h.order < delivery.order for h in assigned.get((incarnation, p, g), [])):
            told_by_other += 1
    result.facts.append(
        (
            f"{group} on {topic}: keys_revoked due / told once / missing-or-late see below",
            f"{required} / {told_once} (exempt: removed unconsumed {exempt}; "
            f"excused repeats {excused})",
        )
    )
    result.facts.append(
        (
            f"{group} on {topic}: gated (partition, generation) delivered / keys_assigned first",
            f"{sum(1 for n in first_of if n in gated)} / {assigned_ok}",
        )
    )
    if told_by_other:
        result.notes.append(
            f"{group} on {topic}: {told_by_other} later instances delivered gated records of "
            "a (partition, generation) without a keys_assigned of their own (after a rebalance)"
        )


def _destinations(destinations: Sequence[tuple[int, int]]) -> str:
    """``[(2, 1), (2, 2), (2, 3), (4, 1)]`` as ``2 (generations 1-3), 4 (generation 1)``."""
    by_partition: dict[int, list[int]] = defaultdict(list)
    for partition, generation in destinations:
        by_partition[partition].append(generation)
    parts = []
    for partition, generations in sorted(by_partition.items()):
        low, high = min(generations), max(generations)
        if low == high:
            parts.append(f"{partition} (generation {low})")
        else:
            parts.append(f"{partition} (generations {low}-{high})")
    return ", ".join(parts) or "-"


# 4. Stale produces -----------------------------------------------------------------------


def check_stale(history: History, snapshots: Sequence[TopicSnapshot]) -> CheckResult:
    result = CheckResult("stale", "Produces naming an older generation are fenced")
    probes = history.stale_probes
    result.facts.append(
        ("stale produces sent", ", ".join(f"{n} {what}" for what, n in probes.most_common()) or "0")
    )
    if probes.get("fenced", 0) == 0:
        result.violations.append("no stale produce was fenced (none sent, or none refused)")
    result.violations += [f"accepted: {what}" for what in history.stale_accepted]
    for snapshot in snapshots:
        for record in snapshot.records:
            if isinstance(parse_value(record.value), int):
                result.violations.append(
                    f"stale produce written: {snapshot.name}[{record.partition}]@{record.offset}"
                )
    for delivery in history.deliveries:
        if delivery.record is None:
            result.violations.append(f"stale produce delivered: {_where(delivery)}")
    return result


# 5. Barrier (zombies) --------------------------------------------------------------------


def check_barrier(history: History, snapshots: Sequence[TopicSnapshot]) -> CheckResult:
    result = CheckResult(
        "barrier", "Nothing written across a barrier (zombies fenced), nothing acknowledged lost"
    )
    checked = relocations = 0
    for snapshot in snapshots:
        log = snapshot.log
        stored: dict[tuple[int, int], StoredRecord] = {}
        later_keys: dict[tuple[int, bytes], int] = {}
        for record in snapshot.records:
            stored[(record.partition, record.offset)] = record
            if record.key is not None:
                slot = (record.partition, record.key)
                later_keys[slot] = max(later_keys.get(slot, -1), record.offset)
            if ROLL_HEADER in record.headers:
                continue
            checked += 1
            where = f"{snapshot.name}[{record.partition}]@{record.offset}"
            stamp = record_stamp(list(record.headers.items()))
            if stamp is None:
                result.violations.append(f"{where}: no stamp of the sidecar")
                continue
            routed_with = stamp.generation
            try:
                lies_in = log.generation_of(record.partition, record.offset)
            except ValueError as exc:
                result.violations.append(f"{where}: {exc}")
                continue
            relocation = record.headers.get(RELOCATION_HEADER) == b"1"
            relocations += relocation
            if routed_with != lies_in:
                ident = parse_value(record.value)
                was_acked = isinstance(ident, tuple) and ident in history.acked
                sidecar, sequence = stamp.sidecar, stamp.sequence
                what = (
                    "written across a barrier (a zombie's late write)"
                    if routed_with < lies_in
                    else "written before its generation began"
                )
                result.violations.append(
                    f"{where}: {what}: routed with generation {routed_with}, lies in "
                    f"{lies_in}; {'relocation tombstone' if relocation else 'record'} "
                    f"{ident} from {sidecar} sequence {sequence}, "
                    f"{'acknowledged' if was_acked else 'not acknowledged'}"
                )
            count = stamp.count
            if (
                record.key is not None
                and not relocation
                and count != log[min(routed_with, log.current.number)].undeleted_count
            ):
                result.violations.append(
                    f"{where}: stamped count {count} is not generation {routed_with}'s count"
                )
            if record.key is not None and not relocation:
                expected = partition_for_key(record.key, log.initial_count, count)
                if expected != record.partition:
                    result.violations.append(
                        f"{where}: key {record.key!r} belongs in {expected} with {count} partitions"
                    )
        missing = superseded = truncated = 0
        for acked in history.acked.values():
            if acked.topic != snapshot.name:
                continue
            where = f"{snapshot.name}[{acked.partition}]@{acked.offset}"
            try:
                lies_in = log.generation_of(acked.partition, acked.offset)
            except ValueError:
                lies_in = -1
            if acked.generation != lies_in:
                result.violations.append(
                    f"{where}: acknowledged {acked.record} (via {acked.sidecar} at "
                    f"{acked.at:.1f} s) as generation {acked.generation}, but the offset lies in "
                    f"generation {lies_in}"
                )
            found = stored.get((acked.partition, acked.offset))
            if found is None:
                if acked.offset < snapshot.log_start.get(acked.partition, 0):
                    truncated += 1
                    continue
                key = stored_key(acked.record[1])
                if snapshot.compacted and later_keys.get((acked.partition, key), -1) > acked.offset:
                    superseded += 1
                    continue
                missing += 1
                result.violations.append(
                    f"{where}: acknowledged {acked.record} (via {acked.sidecar} at "
                    f"{acked.at:.1f} s) is not readable"
                )
            elif parse_value(found.value) != acked.record:
                result.violations.append(
                    f"{where}: acknowledged {acked.record} but the offset holds "
                    f"{parse_value(found.value)}"
                )
        result.facts.append(
            (
                f"{snapshot.name}: acknowledged records missing / compacted away / truncated",
                f"{missing} / {superseded} / {truncated}",
            )
        )
    result.facts.append(
        (
            "stored records checked (relocation tombstones among them)",
            f"{checked:,} ({relocations:,})",
        )
    )
    return result


# 6. The generation log: compaction folds only what is gone, and keeps the rest -----------


def check_generation_log(history: History, snapshot: TopicSnapshot) -> CheckResult:
    """The sidecars' log at the end is the full log folded at its first generation (the
    same kept generations, the waits ``compact`` derives), folded only where every
    boundary of its first generation lies at or below the partition's log start, and
    the harness saw every generation (else the other checks ran on a partial log)."""
    topic = snapshot.name
    result = CheckResult(
        f"log:{topic}",
        f"Generation log of {topic}: compaction folded only generations whose records are "
        "gone, and kept every decision",
    )
    kept = history.kept_logs.get(topic)
    stored = snapshot.stored_log
    if kept is None or stored is None:
        result.notes.append("the run kept no generation log for this topic")
        return result
    trims = [t for t in history.trims if t.topic == topic]
    result.facts += [
        ("generations committed (seen by the harness)", f"{len(kept.generations):,}"),
        (
            "sidecars' log at the end: first generation, length",
            f"{stored.first_number}, {len(stored.generations)}",
        ),
        ("longest log a description showed", f"{kept.longest}"),
        (
            "trims (records read, then deleted), failed",
            f"{len(trims)} ({sum(t.records for t in trims):,}), {history.trims_failed[topic]}",
        ),
    ]
    result.notes += snapshot.fold_notes
    result.violations += kept.disagreements
    missing = kept.missing()
    if missing:
        result.violations.append(
            f"the harness never saw generations {missing[:10]}: the other checks used the "
            "sidecars' log, which lacks what compaction folded"
        )
        return result
    full = snapshot.log
    if compact(full, stored.first_number) != stored:
        result.violations.append(
            f"the sidecars' log from generation {stored.first_number} is not the full log "
            "folded there (kept generations or folded waits differ)"
        )
    if stored.first_number > 0:
        base = full[stored.first_number]
        early = [
            f"{p}: boundary {b.offset} > log start {snapshot.log_start.get(p, 0)}"
            for p, b in enumerate(base.boundaries)
            if b.offset > snapshot.log_start.get(p, 0)
        ]
        if early:
            result.violations.append(
                f"generation {stored.first_number} became the first while records routed "
                f"before it remain: {'; '.join(early[:6])}"
            )
    return result


# 7. Compaction ---------------------------------------------------------------------------


def check_compaction(snapshot: TopicSnapshot) -> CheckResult:
    result = CheckResult(
        "compaction",
        f"Compacted topic {snapshot.name}: no superseded value readable outside the key's "
        "newest partition, except where the gate orders it first",
    )
    waits = LogWaits(snapshot.log)
    values: list[tuple[StoredRecord, RecordId]] = []
    tombstones: dict[tuple[bytes, int], list[int]] = defaultdict(list)
    for record in snapshot.records:
        if record.key is None or ROLL_HEADER in record.headers:
            continue
        if record.value is None:
            if record.headers.get(RELOCATION_HEADER) == b"1":
                tombstones[(record.key, record.partition)].append(record.offset)
            continue
        ident = parse_value(record.value)
        if isinstance(ident, tuple):
            values.append((record, ident))
    newest: dict[bytes, tuple[StoredRecord, RecordId]] = {}
    for record, ident in values:
        held = newest.get(record.key or b"")
        if held is None or ident[2] > held[1][2]:
            newest[record.key or b""] = (record, ident)
    stale = hidden = awaiting = elsewhere_live = 0
    for record, ident in values:
        key = record.key or b""
        latest, latest_ident = newest[key]
        if snapshot.mode(record.partition) is PartitionMode.REMOVED:
            hidden += 1
            continue
        if latest_ident == ident:
            current = partition_for_key(
                key, snapshot.log.initial_count, snapshot.log.current.undeleted_count
            )
            elsewhere_live += record.partition != current
            continue
        if record.partition == latest.partition:
            continue  # superseded in its own partition: plain compaction
        stale += 1
        where = f"{snapshot.name}[{record.partition}]@{record.offset} {ident}"
        latest_generation = snapshot.log.generation_of(latest.partition, latest.offset)
        ordered = any(
            source == record.partition and waits.boundary(source, change) > record.offset
            for source, change in waits.change_sources(latest.partition, latest_generation)
        )
        if not ordered:
            result.violations.append(
                f"{where}: superseded by {latest_ident} in {latest.partition}@{latest.offset} "
                f"(generation {latest_generation}), which does not wait for it"
            )
        after = [o for o in tombstones.get((key, record.partition), []) if o > record.offset]
        cleaned = snapshot.cleaned_up_to.get(record.partition, 0)
        if not after:
            result.violations.append(
                f"{where}: superseded by {latest_ident} in {latest.partition}@{latest.offset}, "
                "and no relocation tombstone follows it (compaction can never drop it)"
            )
        elif min(after) < cleaned:
            result.violations.append(
                f"{where}: still readable although the cleaner compacted {record.partition} "
                f"up to {cleaned} past its tombstone at {min(after)}"
            )
        else:
            awaiting += 1
    result.facts += [
        ("values readable / keys", f"{len(values):,} / {len(newest):,}"),
        ("superseded values readable outside the key's newest partition", f"{stale:,}"),
        ("of them awaiting compaction (tombstone not yet cleaned)", f"{awaiting:,}"),
        ("values in removed partitions (filtered from reads)", f"{hidden:,}"),
        (
            "newest values outside the key's routed partition (not written since it moved)",
            f"{elsewhere_live:,}",
        ),
        (
            "cleaned up to (per partition)",
            ", ".join(f"{p}: {o}" for p, o in sorted(snapshot.cleaned_up_to.items())) or "-",
        ),
    ]
    return result


# 8. Changes and locks --------------------------------------------------------------------


def check_changes(history: History, lock_leak_s: float) -> CheckResult:
    result = CheckResult(
        "changes",
        "Changes never blocked (no leaked lock, a change after the faults) nor misreported",
    )
    outcomes: dict[str, int] = defaultdict(int)
    for change in history.changes:
        if not change.final:
            outcomes[change.outcome] += 1
    result.facts.append(
        ("changes during the load", ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())))
    )
    finals = [c for c in history.changes if c.final]
    if not finals:
        result.violations.append("no change was tried after the faults")
    for change in finals:
        result.facts.append(
            (
                f"after the faults: {change.topic} {change.from_count} -> {change.target}",
                f"{change.outcome} in {change.seconds:.1f} s",
            )
        )
        if change.outcome != "done":
            result.violations.append(
                f"{change.topic}: the change {change.from_count} -> {change.target} after the "
                f"faults ended {change.outcome} after {change.seconds:.1f} s"
            )
    for change in history.changes:
        if (
            change.outcome == "rolled_back"
            and change.count_after == change.target != change.from_count
        ):
            result.violations.append(
                f"{change.topic}: the change {change.from_count} -> {change.target} via "
                f"{change.coordinator} at {change.at:.1f} s was answered 409 40930 (rolled back, "
                f"retriable) after {change.seconds:.1f} s, but the topic then had "
                f"{change.count_after} partitions: it was done"
            )
    longest = 0.0
    for sighting in history.locks.values():
        age = sighting.last_seen - sighting.first_seen
        longest = max(longest, age)
        if age > lock_leak_s:
            result.violations.append(
                f"{sighting.topic}: lock node {sighting.node} of {sighting.owner} held for "
                f"{age:.0f} s ({sighting.first_seen:.0f}-{sighting.last_seen:.0f} s; operation "
                f"journal then: {sighting.operation_phase})"
            )
    result.facts.append(("longest-lived lock node", f"{longest:.1f} s"))
    if history.lock_samples_failed:
        result.notes.append(f"{history.lock_samples_failed} lock samples failed (ZooKeeper away)")
    return result


def run_checks(
    history: History,
    snapshots: Sequence[TopicSnapshot],
    times: RunTimes,
    *,
    liveness_bound_s: float,
    lock_leak_s: float,
) -> list[CheckResult]:
    for snapshot in snapshots:
        history.excuse(compacted_away(history, snapshot))
    results = [
        check_order(history),
        check_liveness(history, times, liveness_bound_s),
        check_handoff(history, snapshots),
        check_stale(history, snapshots),
        check_barrier(history, snapshots),
    ]
    results += [check_generation_log(history, s) for s in snapshots]
    results += [check_compaction(s) for s in snapshots if s.compacted]
    results.append(check_changes(history, lock_leak_s))
    return results


def failing(results: Iterable[CheckResult]) -> list[CheckResult]:
    return [r for r in results if not r.passed]
