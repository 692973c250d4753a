"""What the live audit (``sidecar audit stream``) tells Prometheus, and the tiny HTTP
server in the driver that serves it on ``/metrics``.

- ``sidecar_audit_stream_anomalies_total{kind,topic}``: anomalies found since the
  checkpoint was created. ``kind`` is one of a fixed set; ``topic`` is the anomaly's
  topic for the first ``max_topics`` topics that had one, then ``other``, so a run over
  many topics cannot grow the series without bound.
- ``sidecar_audit_stream_events_total``: audit events checked (since the checkpoint).
- ``sidecar_audit_stream_late_events_total``: events older than the watermark when they
  came (checked against a state that may have forgotten what they needed).
- ``sidecar_audit_stream_lag_seconds``: now minus the newest event time checked, at
  scrape time (NaN before the first event).
- ``sidecar_audit_stream_state_rows{check}``: rows the checks keep in the driver's
  memory after the last micro-batch (``check``: deliveries, records,
  acknowledgements), what the driver's memory grows with.

The counters are totals since the checkpoint was created, not since the process
started: each micro-batch's ``Totals`` are saved with its state, and a process started
again on the checkpoint ``restore``s the last saved ones before it serves anything, so
Prometheus sees one counter go on across restarts (no reset, nothing counted twice,
nothing counted by a killed process before a scrape lost).

No Spark here: the driver hands each micro-batch's counts to ``record_batch``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

OTHER_TOPIC = "other"


@dataclass(frozen=True, slots=True)
class Totals:
    """What the counters hold after a micro-batch; saved with the batch's state."""

    anomalies: dict[tuple[str, str], int] = field(default_factory=dict)
    """By (kind, topic label)."""
    events: int = 0
    late: int = 0

    def plus(self, anomalies: Mapping[tuple[str, str], int], events: int, late: int) -> Totals:
        """These totals and one more batch's counts (anomalies by (kind, topic label))."""
        summed = dict(self.anomalies)
        for labels, count in anomalies.items():
            summed[labels] = summed.get(labels, 0) + count
        return Totals(summed, self.events + events, self.late + late)

    def to_json(self) -> dict[str, Any]:
        return {
            "anomalies": [[kind, topic, n] for (kind, topic), n in sorted(self.anomalies.items())],
            "events": self.events,
            "late": self.late,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Totals:
        anomalies = {(str(kind), str(topic)): int(n) for kind, topic, n in raw["anomalies"]}
        return cls(anomalies, int(raw["events"]), int(raw["late"]))


class StreamMetrics:
    def __init__(
        self, kinds: Collection[str], max_topics: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.registry = CollectorRegistry()
        self._kinds = frozenset(kinds)
        self._max_topics = max_topics
        self._topics: set[str] = set()
        self._clock = clock
        self._newest: float | None = None
        self._lock = threading.Lock()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.anomalies = Counter(
            "sidecar_audit_stream_anomalies",
            "Anomalies the live audit found, by kind and topic (topics past the cap: other).",
            ["kind", "topic"],
            registry=self.registry,
        )
        self.events = Counter(
            "sidecar_audit_stream_events",
            "Audit events the live audit checked.",
            registry=self.registry,
        )
        self.late_events = Counter(
            "sidecar_audit_stream_late_events",
            "Audit events that came older than the watermark.",
            registry=self.registry,
        )
        self.lag = Gauge(
            "sidecar_audit_stream_lag_seconds",
            "Seconds between now and the newest event time the live audit checked.",
            registry=self.registry,
        )
        self.lag.set_function(self._lag)
        self.state_rows = Gauge(
            "sidecar_audit_stream_state_rows",
            "Rows the live audit's checks keep in memory, by check.",
            ["check"],
            registry=self.registry,
        )

    def topic_label(self, topic: str | None) -> str:
        """``topic`` itself for the first ``max_topics`` topics, ``other`` after."""
        name = topic or OTHER_TOPIC
        with self._lock:
            if name in self._topics:
                return name
            if len(self._topics) < self._max_topics:
                self._topics.add(name)
                return name
        return OTHER_TOPIC

    def labelled(
        self, anomalies: Mapping[tuple[str, str | None], int]
    ) -> dict[tuple[str, str], int]:
        """Counts by (kind, topic) as counted: by (kind, topic label). Raises ValueError
        for a kind not in the fixed set."""
        found: dict[tuple[str, str], int] = {}
        for (kind, topic), count in anomalies.items():
            if kind not in self._kinds:
                raise ValueError(f"unknown anomaly kind {kind!r}")
            labels = (kind, self.topic_label(topic))
            found[labels] = found.get(labels, 0) + count
        return found

    def record_batch(
        self,
        *,
        events: int,
        late: int,
        newest: float | None,
        anomalies: Mapping[tuple[str, str | None], int],
        state_rows: Mapping[str, int] | None = None,
    ) -> None:
        """One micro-batch's figures; ``anomalies`` counts by (kind, topic),
        ``state_rows`` the rows kept by check (a fixed set of names)."""
        for check, rows in (state_rows or {}).items():
            self.state_rows.labels(check=check).set(rows)
        for (kind, label), count in self.labelled(anomalies).items():
            self.anomalies.labels(kind=kind, topic=label).inc(count)
        self.events.inc(events)
        self.late_events.inc(late)
        self._note_newest(newest)

    def restore(self, newest: float | None, totals: Totals) -> None:
        """Start the counters from ``totals`` (a checkpoint's), before any batch or
        scrape; their topic labels count against ``max_topics``."""
        for (kind, label), count in totals.anomalies.items():
            if label != OTHER_TOPIC:
                self.topic_label(label)
            self.anomalies.labels(kind=kind, topic=label).inc(count)
        self.events.inc(totals.events)
        self.late_events.inc(totals.late)
        self._note_newest(newest)

    def _note_newest(self, newest: float | None) -> None:
        if newest is not None:
            with self._lock:
                self._newest = newest if self._newest is None else max(self._newest, newest)

    def _lag(self) -> float:
        with self._lock:
            newest = self._newest
        return math.nan if newest is None else self._clock() - newest

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: any free port); the bound port."""
        self._server, self._thread = start_http_server(port, host, self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
