"""Prometheus metrics of one sidecar, in one registry per service instance.

A registry per instance (not the global default) lets tests run several sidecars in
one process and read each one's counters. Names follow Prometheus conventions:
``_total`` counters, ``_seconds`` and ``_bytes`` units, labels of low cardinality
(topic, outcome, kind, phase), never keys or offsets.

Label cardinality is bounded by design, as Karapace normalises request paths: a topic
label is the name only of a topic the sidecar knows exists (a managed topic, or one
Kafka confirmed by serving a request for it), at most ``metrics.max_topic_labels`` of them;
any other topic named in a request counts under ``UNKNOWN_TOPIC`` (and known topics
past the bound under ``OTHER_TOPIC``). So no request, however many topic names it
invents, adds a series. Consumer groups are labelled likewise, at most
``metrics.max_group_labels`` of them (then ``OTHER_GROUP``).
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sidecar.config import MetricsSettings

UNKNOWN_TOPIC: Final = "_unknown"
"""The topic label of requests for topics not known to exist (no such topic, invalid
name, or a request refused before the topic was looked up)."""
OTHER_TOPIC: Final = "_other"
"""The topic label of known topics beyond ``metrics.max_topic_labels``."""
OTHER_GROUP: Final = "_other"
"""The group label of consumer groups beyond ``metrics.max_group_labels``."""

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_HOLD_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class SidecarMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, limits: MetricsSettings | None = None
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.limits = limits or MetricsSettings()
        self._topic_labels: set[str] = set()
        self._group_labels: set[str] = set()
        r = self.registry
        self.produce_requests = Counter(
            "sidecar_produce_requests_total",
            "Produce requests answered, by topic and outcome (ok, partial, error code).",
            ["topic", "outcome"],
            registry=r,
        )
        self.produce_records = Counter(
            "sidecar_produce_records_total",
            "Records produced, by topic and outcome (written, failed).",
            ["topic", "outcome"],
            registry=r,
        )
        self.produce_bytes = Counter(
            "sidecar_produce_bytes_total",
            "Key plus value bytes of written records.",
            ["topic"],
            registry=r,
        )
        self.produce_latency = Histogram(
            "sidecar_produce_latency_seconds",
            "Produce request latency, from the request's arrival to its answer.",
            ["topic", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.held_requests = Gauge(
            "sidecar_produce_held_requests",
            "Produce requests held right now (barrier pending or metadata being re-read).",
            ["topic"],
            registry=r,
        )
        self.hold_seconds = Histogram(
            "sidecar_produce_hold_seconds",
            "How long held produce requests waited before they were routed.",
            ["topic"],
            buckets=_HOLD_BUCKETS,
            registry=r,
        )
        self.fenced = Counter(
            "sidecar_produce_fenced_total",
            "Produce requests refused because they named an older generation or count.",
            ["topic"],
            registry=r,
        )
        self.unknown_generation = Counter(
            "sidecar_produce_unknown_generation_total",
            "Produce requests naming a generation newer than this sidecar knows.",
            ["topic"],
            registry=r,
        )
        self.barrier_seconds = Histogram(
            "sidecar_barrier_phase_seconds",
            "Duration of each phase of a partition-count change this sidecar coordinated.",
            ["topic", "phase"],
            buckets=_HOLD_BUCKETS,
            registry=r,
        )
        self.barrier_acks = Counter(
            "sidecar_barrier_acks_total",
            "Barriers this sidecar acknowledged.",
            ["topic"],
            registry=r,
        )
        self.producers_fenced = Counter(
            "sidecar_producers_fenced_total",
            "Transactional ids this sidecar fenced as a change's coordinator (possible zombies).",
            registry=r,
        )
        self.producer_incarnations = Counter(
            "sidecar_producer_incarnations_total",
            "Transactional producers this sidecar started (a new one per session or fence).",
            registry=r,
        )
        self.transactions = Counter(
            "sidecar_transactions_total",
            "Transactions of managed-topic writes, by outcome (committed; failed: in doubt, "
            "settled by re-initialising the id; fenced; aborted: after an earlier one failed).",
            ["outcome"],
            registry=r,
        )
        self.admin_operations = Counter(
            "sidecar_admin_operations_total",
            "Admin operations, by kind (create, adopt, expand, shrink) and result.",
            ["kind", "result"],
            registry=r,
        )
        self.truncated_boundaries = Gauge(
            "sidecar_truncated_boundaries",
            "Boundaries of the topic's generation log its partitions' logs no longer reach "
            "(KIP-320: an unclean leader election truncated acknowledged records), as this "
            "sidecar last checked before a change or retirement.",
            ["topic"],
            registry=r,
        )
        self.relocation_tombstones = Counter(
            "sidecar_relocation_tombstones_total",
            "Tombstones written to an ancestor partition of a compacted topic.",
            ["topic"],
            registry=r,
        )
        self.records_without_headers = Counter(
            "sidecar_records_without_sidecar_headers_total",
            "Records read from managed topics that no sidecar wrote (bypassing producers).",
            ["topic"],
            registry=r,
        )
        self.generation = Gauge(
            "sidecar_topic_generation",
            "Current committed generation of each managed topic, as this sidecar knows it.",
            ["topic"],
            registry=r,
        )
        self.generation_log_length = Gauge(
            "sidecar_topic_generation_log_length",
            "Generations the topic's log keeps (from its first, once compacted, to the "
            "current one), as this sidecar last read it.",
            ["topic"],
            registry=r,
        )
        self.generations_folded = Counter(
            "sidecar_generations_folded_total",
            "Generations this sidecar folded by compacting the topic's generation log.",
            ["topic"],
            registry=r,
        )
        self.partition_count = Gauge(
            "sidecar_topic_undeleted_partitions",
            "Undeleted (read-write) partition count of each managed topic.",
            ["topic"],
            registry=r,
        )
        self.delivered_records = Counter(
            "sidecar_consumer_delivered_records_total",
            "Records delivered to apps, by topic and partition.",
            ["topic", "partition"],
            registry=r,
        )
        self.gated_partitions = Gauge(
            "sidecar_gated_partitions",
            "Partition heads held by the gate right now, by topic and group.",
            ["topic", "group"],
            registry=r,
        )
        self.gate_wait_seconds = Histogram(
            "sidecar_gate_wait_seconds",
            "How long a partition head waited at the gate, by reason (expansion, shrink).",
            ["topic", "group", "reason"],
            buckets=_HOLD_BUCKETS,
            registry=r,
        )
        self.callback_seconds = Histogram(
            "sidecar_handoff_callback_seconds",
            "Latency of the app's callbacks (key hand-off; rebalances when asked for), by kind.",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.callback_failures = Counter(
            "sidecar_handoff_callback_failures_total",
            "Hand-off callback attempts that failed or timed out (they are retried).",
            ["kind"],
            registry=r,
        )
        self.consumer_truncations = Counter(
            "sidecar_consumer_truncations_total",
            "Times a consumer instance found the log cut below what it had read (an unclean "
            "leader election, KIP-320) and read again from where the logs diverge, by group "
            "and topic.",
            ["group", "topic"],
            registry=r,
        )
        self.consumer_truncated_records = Counter(
            "sidecar_consumer_truncated_records_total",
            "Offsets a consumer instance had read that the log no longer has (lost to an "
            "unclean leader election): its records and the transaction markers among them, "
            "by group and topic.",
            ["group", "topic"],
            registry=r,
        )
        self.commits = Counter(
            "sidecar_consumer_commits_total",
            "Offsets committed for consumer groups, by group and topic.",
            ["group", "topic"],
            registry=r,
        )
        self.rebalances = Counter(
            "sidecar_consumer_rebalances_total",
            "Rebalances a consumer instance went through (partitions assigned), by group.",
            ["group"],
            registry=r,
        )
        self.rebalance_requests = Counter(
            "sidecar_consumer_rebalance_requests_total",
            "Rebalances the sidecar asked of an instance's group because a change altered "
            "the assignable partitions of a topic it reads, by group.",
            ["group"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "sidecar_consumer_lag",
            "High watermark minus delivered position of each assigned partition.",
            ["group", "topic", "partition"],
            registry=r,
        )
        self.audit_events = Counter(
            "sidecar_audit_events_total",
            "Audit events written to the audit topic.",
            registry=r,
        )
        self.audit_dropped = Counter(
            "sidecar_audit_events_dropped_total",
            "Audit events dropped (buffer full or not written): the audit has a gap.",
            registry=r,
        )
        self.http_connections = Gauge(
            "sidecar_http_connections",
            "HTTP connections open now.",
            registry=r,
        )
        self.http_connections_refused = Counter(
            "sidecar_http_connections_refused_total",
            "HTTP connections refused because http.max_connections were open.",
            registry=r,
        )
        self.http_timeouts = Counter(
            "sidecar_http_read_timeouts_total",
            "HTTP connections closed because a request head or body arrived too slowly.",
            ["part"],
            registry=r,
        )
        self.zookeeper_connected = Gauge(
            "sidecar_zookeeper_connected",
            "1 while the ZooKeeper session is connected, else 0 (managed produces hold).",
            registry=r,
        )

    def topic_label(self, topic: str, *, exists: bool) -> str:
        """The label to count a request for ``topic`` under.

        ``exists`` says whether the caller knows the topic exists (it is managed, or
        Kafka just served it). A topic once labelled keeps its label; one not known to
        exist is ``UNKNOWN_TOPIC``; past ``metrics.max_topic_labels`` names, ``OTHER_TOPIC``.
        """
        if topic in self._topic_labels:
            return topic
        if not exists:
            return UNKNOWN_TOPIC
        if len(self._topic_labels) >= self.limits.max_topic_labels:
            return OTHER_TOPIC
        self._topic_labels.add(topic)
        return topic

    def group_label(self, group: str) -> str:
        """The label to count a consumer group under: its name, for the first
        ``metrics.max_group_labels`` groups this sidecar served; ``OTHER_GROUP`` after that.
        Group names are the apps' choice, and an app that makes a group per run must
        not grow the exposition for ever."""
        if group in self._group_labels:
            return group
        if len(self._group_labels) >= self.limits.max_group_labels:
            return OTHER_GROUP
        self._group_labels.add(group)
        return group
