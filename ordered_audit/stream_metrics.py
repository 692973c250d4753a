"""What the live audit (``sidecar audit stream``) tells Prometheus, and the tiny HTTP
server in the driver that serves it on ``/metrics``.

- ``sidecar_audit_stream_anomalies_total{kind,topic}``: anomalies found since this
  process started. ``kind`` is one of a fixed set; ``topic`` is the anomaly's topic for
  the first ``max_topics`` topics that had one, then ``other``, so a run over many
  topics cannot grow the series without bound.
- ``sidecar_audit_stream_events_total``: audit events checked.
- ``sidecar_audit_stream_late_events_total``: events older than the watermark when they
  came (checked against a state that may have forgotten what they needed).
- ``sidecar_audit_stream_lag_seconds``: now minus the newest event time checked, at
  scrape time (NaN before the first event).

No Spark here: the driver hands each micro-batch's counts to ``record_batch``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

OTHER_TOPIC = "other"


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

    def record_batch(
        self,
        *,
        events: int,
        late: int,
        newest: float | None,
        anomalies: Mapping[tuple[str, str | None], int],
    ) -> None:
        """One micro-batch's figures; ``anomalies`` counts by (kind, topic)."""
        for (kind, topic), count in anomalies.items():
            if kind not in self._kinds:
                raise ValueError(f"unknown anomaly kind {kind!r}")
            self.anomalies.labels(kind=kind, topic=self.topic_label(topic)).inc(count)
        self.events.inc(events)
        self.late_events.inc(late)
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
