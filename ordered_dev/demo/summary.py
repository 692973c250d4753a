"""What the demo observed, the checks it makes on it, and how it is printed (no IO).

The ledger is the demo's own record, kept on the client side of the HTTP API: what the
producers sent and Kafka acknowledged, where each record landed and under which
generation, what the consumer instances received (in the order the app received it,
across instances: they all run in the demo's one event loop), and the hand-off
callbacks the app was sent. The order check works on the ledger alone, so it judges
the sidecars from outside, as an application would.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sidecar.core.routing import default_partition

SampleKey = tuple[str, frozenset[tuple[str, str]]]
"""A Prometheus sample: its name (with _bucket/_count/_sum) and its labels."""
Samples = Mapping[SampleKey, float]


@dataclass(frozen=True, slots=True)
class Request:
    """One produce request as its producer saw it."""

    began: float
    latency_s: float
    status: int


@dataclass(frozen=True, slots=True)
class Handoff:
    """One hand-off callback the app answered."""

    began: float
    ended: float
    kind: str
    """keys_revoked or keys_assigned"""
    instance: str
    partition: int
    generation: int


@dataclass
class Ledger:
    next_seq: Counter[str] = field(default_factory=Counter)
    """The next sequence number of each key (keys belong to one producer each)."""
    acknowledged: set[tuple[str, int]] = field(default_factory=set)
    """(key, seq) Kafka acknowledged through a sidecar."""
    placement: dict[str, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    """key -> generation -> partition its acknowledged records landed in."""
    requests: list[Request] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    """Requests (or records) answered with an error, by status and error code."""
    delivered: list[tuple[str, int]] = field(default_factory=list)
    """(key, seq) in the order the app received them, duplicates included."""
    poll_errors: Counter[str] = field(default_factory=Counter)
    handoffs: list[Handoff] = field(default_factory=list)

    def undelivered(self) -> int:
        return len(self.acknowledged - set(self.delivered))


@dataclass(frozen=True, slots=True)
class OrderCheck:
    keys: int
    deliveries: int
    distinct: int
    duplicates: int
    """Records delivered again (at-least-once), each re-delivery counted."""
    late: tuple[tuple[str, int, int], ...]
    """(key, seq, newer seq delivered before it): a record overtaken by a later one."""
    lost: int
    """Acknowledged records never delivered."""

    @property
    def verified(self) -> bool:
        return not self.late and self.lost == 0


def check_order(
    delivered: Sequence[tuple[str, int]], acknowledged: Iterable[tuple[str, int]]
) -> OrderCheck:
    """Every key's records must reach the app in the order they were produced.

    A record delivered after a later record of its key (one it had not been delivered
    before) is out of order; one delivered again is a duplicate, allowed: delivery is
    at-least-once. An acknowledged record that never arrived is lost.
    """
    highest: dict[str, int] = {}
    seen: dict[str, set[int]] = defaultdict(set)
    duplicates = 0
    late: list[tuple[str, int, int]] = []
    for key, seq in delivered:
        if seq in seen[key]:
            duplicates += 1
            continue
        top = highest.get(key, -1)
        if seq < top:
            late.append((key, seq, top))
        else:
            highest[key] = seq
        seen[key].add(seq)
    distinct = sum(len(seqs) for seqs in seen.values())
    got = {(key, seq) for key, seqs in seen.items() for seq in seqs}
    lost = sum(1 for record in acknowledged if record not in got)
    return OrderCheck(len(seen), len(delivered), distinct, duplicates, tuple(late), lost)


# Keys moved ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Moves:
    keys_seen: int
    """Keys written both before and after the change."""
    moved: int
    pairs: Counter[tuple[int, int]]
    """(from partition, to partition) -> keys that moved so."""
    modulo_moved: int
    """Of the same keys, how many ``hash % N`` (Kafka's default partitioner) would move."""
    modulo_pairs: int
    """Between how many distinct (from, to) partition pairs ``hash % N`` would move them."""


def key_bytes(key: str) -> bytes:
    """The bytes Kafka stores for a string key sent in the json embedded format (compact
    JSON, so with its quotes): what the partitioner hashes."""
    return ('"' + key + '"').encode()


def moves(
    placement: Mapping[str, Mapping[int, int]],
    from_generation: int,
    from_count: int,
    to_count: int,
) -> Moves:
    """Keys whose partition changed from ``from_generation`` to the next one, observed in
    the produce answers, against what ``hash % N`` would have done to the same keys."""
    pairs: Counter[tuple[int, int]] = Counter()
    seen = moved = modulo_moved = 0
    modulo: set[tuple[int, int]] = set()
    for key, by_generation in placement.items():
        before = by_generation.get(from_generation)
        after = by_generation.get(from_generation + 1)
        if before is None or after is None:
            continue
        seen += 1
        if before != after:
            moved += 1
            pairs[(before, after)] += 1
        old = default_partition(key_bytes(key), from_count)
        new = default_partition(key_bytes(key), to_count)
        if old != new:
            modulo_moved += 1
            modulo.add((old, new))
    return Moves(seen, moved, pairs, modulo_moved, len(modulo))


def default_agreement(placement: Mapping[str, Mapping[int, int]], count: int) -> tuple[int, int]:
    """(keys routed where Kafka's default partitioner puts them, keys written) in
    generation 0, whose count is the topic's initial one: linear hashing is then exactly
    the default partitioner, so a Java producer and the sidecar agree."""
    keys = [(key, g[0]) for key, g in placement.items() if 0 in g]
    agree = sum(default_partition(key_bytes(key), count) == p for key, p in keys)
    return agree, len(keys)


# Metrics ---------------------------------------------------------------------------------


def total(samples: Samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    """A histogram's growth between two scrapes, summed over sidecars and labels."""

    count: float
    sum: float
    cumulative: tuple[tuple[float, float], ...]
    """(upper bound, cumulative count), ascending, +Inf last."""

    @property
    def longest(self) -> float:
        """The upper bound of the highest bucket that grew (NaN when none did)."""
        previous = 0.0
        longest = math.nan
        for bound, cumulative in self.cumulative:
            if cumulative > previous:
                longest = bound
            previous = cumulative
        return longest


def histogram_delta(before: Samples, after: Samples, name: str, **labels: str) -> HistogramDelta:
    wanted = set(labels.items())

    def buckets(samples: Samples) -> dict[float, float]:
        by_bound: dict[float, float] = defaultdict(float)
        for (sample, ls), value in samples.items():
            if sample == f"{name}_bucket" and wanted <= ls:
                by_bound[float(dict(ls)["le"])] += value
        return by_bound

    start, end = buckets(before), buckets(after)
    cumulative = tuple(
        (bound, max(0.0, end[bound] - start.get(bound, 0.0))) for bound in sorted(end)
    )
    count = total(after, f"{name}_count", **labels) - total(before, f"{name}_count", **labels)
    seconds = total(after, f"{name}_sum", **labels) - total(before, f"{name}_sum", **labels)
    return HistogramDelta(max(0.0, count), max(0.0, seconds), cumulative)


# Changes ---------------------------------------------------------------------------------


@dataclass
class Change:
    kind: str
    """expand or shrink"""
    from_count: int
    to_count: int
    via: str
    """How the demo asked for it (the CLI or the admin API) and through which sidecar."""
    began: float
    ended: float = math.nan
    from_generation: int = 0
    outcome: str = ""
    """done, or what went wrong."""
    took_s: float = math.nan
    """From the start the change's journal records to its answer."""
    metrics_before: Samples = field(default_factory=dict)
    metrics_after: Samples = field(default_factory=dict)
    """Scrapes of every sidecar at the change's start and at the next change's start (or
    the end of the run): gate waits come after the commit, so the period runs on."""

    @property
    def done(self) -> bool:
        return self.outcome == "done"


@dataclass(frozen=True, slots=True)
class ChangeFigures:
    change: Change
    moves: Moves
    holds: HistogramDelta
    gate_waits: HistogramDelta
    fenced: float
    longest_request_s: float
    """The slowest produce request that overlapped the change, as the producer saw it."""
    revoked: tuple[Handoff, ...]
    assigned: tuple[Handoff, ...]

    @property
    def handoff_in_order(self) -> bool:
        """Every moved key's source was told keys_revoked, and each such callback had
        finished before keys_assigned started on a partition those keys moved to."""
        revoked = {h.partition: h for h in self.revoked}
        assigned = {h.partition: h for h in self.assigned}
        for source, destination in self.moves.pairs:
            if source not in revoked:
                return False
            if destination in assigned and assigned[destination].began < revoked[source].ended:
                return False
        return True

    @property
    def revoked_once(self) -> bool:
        partitions = [h.partition for h in self.revoked]
        return len(partitions) == len(set(partitions))


def figures(change: Change, ledger: Ledger, topic: str) -> ChangeFigures:
    generation = change.from_generation + 1
    overlapping = [
        r.latency_s
        for r in ledger.requests
        if r.began <= change.ended and r.began + r.latency_s >= change.began
    ]
    fenced = total(change.metrics_after, "sidecar_produce_fenced_total", topic=topic) - total(
        change.metrics_before, "sidecar_produce_fenced_total", topic=topic
    )
    return ChangeFigures(
        change=change,
        moves=moves(ledger.placement, change.from_generation, change.from_count, change.to_count),
        holds=histogram_delta(
            change.metrics_before,
            change.metrics_after,
            "sidecar_produce_hold_seconds",
            topic=topic,
        ),
        gate_waits=histogram_delta(
            change.metrics_before, change.metrics_after, "sidecar_gate_wait_seconds", topic=topic
        ),
        fenced=fenced,
        longest_request_s=max(overlapping, default=math.nan),
        revoked=tuple(
            h for h in ledger.handoffs if h.generation == generation and h.kind == "keys_revoked"
        ),
        assigned=tuple(
            h for h in ledger.handoffs if h.generation == generation and h.kind == "keys_assigned"
        ),
    )


# Rendering -------------------------------------------------------------------------------


def seconds(value: float) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "> 30 s"
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def quantile(ordered: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ascending ``ordered`` (NaN when empty)."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def plural(count: float, word: str) -> str:
    return word if count == 1 else word + "s"


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def render_change(f: ChangeFigures) -> list[str]:
    c, m = f.change, f.moves
    title = (
        f"{c.kind} {c.from_count} -> {c.to_count} (generation {c.from_generation} -> "
        f"{c.from_generation + 1}) via {c.via}: {c.outcome} in {seconds(c.took_s)}"
    )
    if not c.done:
        return [title]
    pairs = ", ".join(f"{a}->{b} ({n})" for (a, b), n in sorted(m.pairs.items())) or "none"
    holds = (
        f"{f.holds.count:,.0f} {plural(f.holds.count, 'request')} held by the sidecars, "
        f"{seconds(f.holds.sum)} in all, "
        f"longest <= {seconds(f.holds.longest)}"
        if f.holds.count
        else "no request was held (the barrier fell between two requests)"
    )
    waits = (
        f"{f.gate_waits.count:,.0f} partition {plural(f.gate_waits.count, 'head')} waited for "
        "their blockers, "
        f"longest <= {seconds(f.gate_waits.longest)}"
        if f.gate_waits.count
        else "none (the group had consumed every blocker to its boundary already)"
    )

    def told(handoffs: Sequence[Handoff]) -> str:
        return ", ".join(f"p{h.partition} to {h.instance}" for h in handoffs) or "none"

    return [
        title,
        f"    keys moved       {m.moved} of {m.keys_seen} keys written before and after "
        f"({percent(m.moved, m.keys_seen)}), only {pairs}",
        f"    hash % N         would have moved {m.modulo_moved} of them "
        f"({percent(m.modulo_moved, m.keys_seen)}), between {m.modulo_pairs} partition pairs",
        f"    produce holds    {holds}; slowest request seen by a producer "
        f"{seconds(f.longest_request_s)}; fenced {f.fenced:,.0f}",
        f"    gate waits       {waits}",
        f"    hand-off         keys_revoked {told(f.revoked)}; keys_assigned {told(f.assigned)}",
        f"                     each moved key's source revoked once, before the destination "
        f"was assigned: {'yes' if f.handoff_in_order and f.revoked_once else 'NO'}",
    ]


def render_summary(
    ledger: Ledger, check: OrderCheck, changes: Sequence[ChangeFigures], topic: str
) -> list[str]:
    requests = len(ledger.requests)
    latencies = sorted(r.latency_s for r in ledger.requests if r.status == 200)
    refused = ", ".join(f"{n} x {what}" for what, n in ledger.refused.most_common()) or "none"
    lines = [
        f"Summary of {topic}",
        f"  produced         {len(ledger.acknowledged):,} records acknowledged in "
        f"{requests:,} requests through 3 sidecars; refused: {refused}",
        f"  request latency  p50 {seconds(quantile(latencies, 0.5))}, p99 "
        f"{seconds(quantile(latencies, 0.99))}, max {seconds(quantile(latencies, 1.0))} (each "
        "request waits for its transaction to commit)",
        f"  delivered        {check.deliveries:,} records to the group ({check.distinct:,} "
        f"distinct, {check.duplicates:,} duplicates)",
        f"  hand-off events  {len(ledger.handoffs)} callbacks answered by the app "
        f"({sum(h.kind == 'keys_revoked' for h in ledger.handoffs)} keys_revoked, "
        f"{sum(h.kind == 'keys_assigned' for h in ledger.handoffs)} keys_assigned)",
    ]
    if ledger.poll_errors:
        errors = ", ".join(f"{n} x {what}" for what, n in ledger.poll_errors.most_common(3))
        lines.append(f"  poll errors      {errors}")
    lines.append("")
    for figure in changes:
        lines += ["  " + line for line in render_change(figure)]
    lines.append("")
    if check.verified:
        lines.append(
            f"  per-key order    VERIFIED: every one of {check.keys} keys had its records "
            f"delivered in the order produced ({check.duplicates:,} duplicates, 0 lost)"
        )
    else:
        lines.append(
            f"  per-key order    VIOLATED: {len(check.late):,} records delivered after a later "
            f"record of their key, {check.lost:,} acknowledged records never delivered"
        )
        lines += [
            f"    {key}: seq {seq} delivered after seq {newer}"
            for key, seq, newer in check.late[:10]
        ]
    return lines
