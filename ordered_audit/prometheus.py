"""Prometheus range data for the audit window, and what it says about a period of time.

The job asks ``/api/v1/query_range`` for raw counter and histogram series, per scrape
target and topic, not for ``rate()`` and ``histogram_quantile()`` of them: a labelled
counter or histogram child is created at its first observation, so its first sample
already holds that observation and ``rate()`` (which needs two samples) never shows
it. The first hold of a topic, often the only one after a quiet hour, would be
invisible. Instead a period's increase is summed from consecutive samples of each
target's series, counting a series that appeared inside the window from 0 and a drop
as a counter reset (a restarted sidecar); per target, because in a sum over targets a
sidecar that goes away looks like a reset. Gauges are asked for per topic. Pure except
``fetch``.
"""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# name -> PromQL. Counters and histograms per scrape target (instance) and topic.
QUERIES = {
    "held_requests": "max by (topic) (sidecar_produce_held_requests)",
    "hold_seconds": "sum by (instance, topic, le) (sidecar_produce_hold_seconds_bucket)",
    "fenced": "sum by (instance, topic) (sidecar_produce_fenced_total)",
    "gated_partitions": "sum by (topic) (sidecar_gated_partitions)",
    "gate_wait_seconds": "sum by (instance, topic, le) (sidecar_gate_wait_seconds_bucket)",
}
# Points per series the default step aims at: enough to place a change to the second in
# an hour, few enough that many targets x topics x buckets stay a small download.
TARGET_POINTS = 2_000


class PrometheusError(Exception):
    """Prometheus could not be reached or refused a query."""


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    """The key of ``QUERIES`` it answers."""
    instance: str | None
    topic: str | None
    le: float | None
    """Bucket upper bound of a histogram series (``math.inf`` for +Inf), else None."""
    points: tuple[tuple[float, float], ...]
    """(epoch seconds, value), in time order."""
    existed_at_start: bool = True
    """Whether the series had a value when the query's range began (else it appeared
    later, and its growth counts from 0)."""


@dataclass(frozen=True, slots=True)
class PeriodStats:
    """What the metrics say about one period (an operation, a time bucket)."""

    held_max: float | None
    """Most produce requests held at once (a gauge: what the scrapes caught)."""
    hold_p99_s: float | None
    """99th percentile of the produce holds that ended in the period."""
    hold_max_s: float | None
    """Upper bound of the longest hold (its histogram bucket's bound)."""
    holds: float | None
    fenced: float | None
    """Produce requests fenced in the period."""
    gated_max: float | None
    """Most partition heads held by the gate at once (a gauge)."""
    gate_wait_p99_s: float | None
    gate_wait_max_s: float | None
    """Upper bound of the longest gate stall that ended in the period."""
    gate_waits: float | None


def default_step(start: float, end: float) -> float:
    """A step of whole seconds, at least 1, giving about TARGET_POINTS points a series."""
    return float(max(1, math.ceil((end - start) / TARGET_POINTS)))


def fetch(
    base_url: str,
    start: float,
    end: float,
    step: float,
    queries: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> list[Series]:
    """Every series of ``queries`` (default QUERIES) over [start, end].

    Raises PrometheusError when Prometheus is unreachable or answers with an error.
    """
    found: list[Series] = []
    for name, query in (queries or QUERIES).items():
        params = urllib.parse.urlencode(
            {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        )
        url = f"{base_url.rstrip('/')}/api/v1/query_range?{params}"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                body = json.load(response)
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"query_range {query!r} at {base_url} failed: {exc}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"query_range {query!r}: {body.get('error', body)}")
        found.extend(parse_matrix(name, body["data"]["result"], start, step))
    return found


def parse_matrix(
    name: str, result: Iterable[Mapping[str, Any]], start: float, step: float
) -> list[Series]:
    """The series of a ``query_range`` matrix result over a range from ``start``."""
    series = []
    for item in result:
        labels: Mapping[str, str] = item.get("metric") or {}
        values: list[list[Any]] = item.get("values") or []
        le = labels.get("le")
        points = tuple((float(t), float(v)) for t, v in values if not math.isnan(float(v)))
        series.append(
            Series(
                name,
                labels.get("instance"),
                labels.get("topic"),
                None if le is None else float(le),  # float("+Inf") is inf
                points,
                existed_at_start=bool(points) and points[0][0] < start + step / 2,
            )
        )
    return series


def _growth(series: Series) -> Iterator[tuple[float, float]]:
    """(time, growth since the previous point) of each point of a counter series: a
    series that appeared inside the query's range grew from 0, a drop is a reset (the
    new value is all growth)."""
    if not series.points:
        return
    previous = series.points[0][1] if series.existed_at_start else 0.0
    for time, value in series.points:
        yield time, (value - previous if value >= previous else value)
        previous = value


def increase(series: Series, start: float, end: float) -> float:
    """How much a counter series grew in [start, end)."""
    return sum(growth for time, growth in _growth(series) if start <= time < end)


def gauge_max(points: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    inside = [value for time, value in points if start <= time < end]
    return max(inside) if inside else None


def bucket_quantile(quantile: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative (upper bound, count) pairs:
    linear within the bucket, the highest finite bound for the +Inf bucket. None when
    the histogram is empty."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = quantile * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def largest_bucket(buckets: Sequence[tuple[float, float]]) -> float | None:
    """The upper bound of the highest non-empty bucket (the largest finite bound when
    observations fell into +Inf); None when empty."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    finite = [bound for bound, _ in ordered if not math.isinf(bound)]
    for bound, count in ordered:
        if count >= total:
            return bound if not math.isinf(bound) else (finite[-1] if finite else None)
    return None


GAUGES = frozenset({"held_requests", "gated_partitions"})


class _Totals:
    """What the series say about one period: gauge maxima, counter and bucket growth."""

    def __init__(self) -> None:
        self.gauges: dict[str, float] = {}
        self.counters: dict[str, float] = {}
        self.histograms: dict[str, dict[float, float]] = {}

    def add(self, series: Series, value: float) -> None:
        """A gauge's value, or a counter's or bucket's growth, inside the period."""
        name = series.name
        if name in GAUGES:
            self.gauges[name] = max(self.gauges.get(name, value), value)
        elif series.le is None:
            self.counters[name] = self.counters.get(name, 0.0) + value
        else:
            bounds = self.histograms.setdefault(name, {})
            bounds[series.le] = bounds.get(series.le, 0.0) + value

    def stats(self, present: set[str]) -> PeriodStats:
        """``present``: the names with any series in the window (the others are None)."""

        def histogram(name: str) -> tuple[float | None, float | None, float | None]:
            if name not in present:
                return None, None, None
            buckets = list(self.histograms.get(name, {}).items())
            total = max((count for _, count in buckets), default=0.0)
            return bucket_quantile(0.99, buckets), largest_bucket(buckets), total

        hold_p99, hold_max, holds = histogram("hold_seconds")
        wait_p99, wait_max, waits = histogram("gate_wait_seconds")
        return PeriodStats(
            held_max=self.gauges.get("held_requests"),
            hold_p99_s=hold_p99,
            hold_max_s=hold_max,
            holds=holds,
            fenced=self.counters.get("fenced", 0.0) if "fenced" in present else None,
            gated_max=self.gauges.get("gated_partitions"),
            gate_wait_p99_s=wait_p99,
            gate_wait_max_s=wait_max,
            gate_waits=waits,
        )


def _values(series: Series) -> Iterable[tuple[float, float]]:
    return series.points if series.name in GAUGES else _growth(series)


def period_stats(
    series: Sequence[Series], start: float, end: float, topic: str | None = None
) -> PeriodStats:
    """The metrics over [start, end), for ``topic`` or over every topic (gauges: the
    largest of any topic; counters and histograms: summed)."""
    chosen = [s for s in series if topic is None or s.topic == topic]
    totals = _Totals()
    for one in chosen:
        for time, value in _values(one):
            if start <= time < end:
                totals.add(one, value)
    return totals.stats({s.name for s in chosen})


def bucket_stats(
    series: Sequence[Series], origin: float, size: float, count: int
) -> list[PeriodStats]:
    """``period_stats`` over every topic for the ``count`` buckets of ``size`` seconds
    from ``origin``, in one pass over the points."""
    totals = [_Totals() for _ in range(count)]
    end = origin + size * count
    for one in series:
        for time, value in _values(one):
            if origin <= time < end:
                totals[min(int((time - origin) // size), count - 1)].add(one, value)
    present = {s.name for s in series}
    return [bucket.stats(present) for bucket in totals]
