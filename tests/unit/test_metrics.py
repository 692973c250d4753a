"""Metric label cardinality is bounded: topics are labelled only when known to exist."""

from __future__ import annotations

from prometheus_client import generate_latest

from sidecar.config import MetricsSettings
from sidecar.metrics import (
    OTHER_GROUP,
    OTHER_TOPIC,
    UNKNOWN_TOPIC,
    SidecarMetrics,
)


def test_a_topic_not_known_to_exist_is_counted_under_one_label() -> None:
    metrics = SidecarMetrics()
    labels = {metrics.topic_label(f"invented-{i}", exists=False) for i in range(500)}
    assert labels == {UNKNOWN_TOPIC}


def test_a_known_topic_keeps_its_label_also_when_a_later_request_fails() -> None:
    metrics = SidecarMetrics()
    assert metrics.topic_label("orders", exists=True) == "orders"
    assert metrics.topic_label("orders", exists=False) == "orders"


def test_known_topics_past_the_bound_share_one_label() -> None:
    bound = MetricsSettings().max_topic_labels
    metrics = SidecarMetrics()
    labels = [metrics.topic_label(f"t{i}", exists=True) for i in range(bound + 50)]
    assert len(set(labels)) == bound + 1
    assert labels[-1] == OTHER_TOPIC
    assert metrics.topic_label("t0", exists=True) == "t0"


def test_the_exposition_does_not_grow_with_invented_topics() -> None:
    metrics = SidecarMetrics()

    def count(topic: str) -> None:
        label = metrics.topic_label(topic, exists=False)
        metrics.produce_requests.labels(label, "40401").inc()
        metrics.produce_latency.labels(label, "40401").observe(0.001)

    count("first")
    before = series(metrics)
    for i in range(300):
        count(f"invented-{i}")
    assert series(metrics) == before


def series(metrics: SidecarMetrics) -> set[str]:
    """The exposition's series: each sample line's name and labels, without its value."""
    text = generate_latest(metrics.registry).decode()
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}


def test_consumer_groups_past_the_bound_share_one_label() -> None:
    bound = MetricsSettings().max_group_labels
    metrics = SidecarMetrics()
    labels = [metrics.group_label(f"run-{i}") for i in range(bound + 30)]
    assert len(set(labels)) == bound + 1
    assert labels[-1] == OTHER_GROUP
    assert metrics.group_label("run-0") == "run-0"


def test_the_bounds_are_settings() -> None:
    metrics = SidecarMetrics(limits=MetricsSettings(max_topic_labels=2, max_group_labels=1))
    topics = [metrics.topic_label(f"t{i}", exists=True) for i in range(4)]
    assert topics == ["t0", "t1", OTHER_TOPIC, OTHER_TOPIC]
    assert [metrics.group_label(g) for g in ("a", "b")] == ["a", OTHER_GROUP]
