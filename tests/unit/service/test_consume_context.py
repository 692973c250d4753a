"""What the consume path is given (``sidecar.service.consume_context``).

``ConsumerMetrics`` is checked over a real ``SidecarMetrics``: which series each event
of the consume path moves, by how much, and that topics and groups are labelled
through the registry's bounds. The ports (``ManagedTopics``, ``GroupStore``,
``GroupOffsets``, ``InstanceConsumer``, ``AppCallbacks``) are checked against the
adapters the sidecar fills them with, so a fake of a port in the unit tests cannot drift
from what runs.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.adapters.callbacks import CallbackClient
from sidecar.adapters.group_consumer import GroupConsumer
from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.config import MetricsSettings
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.generations import ChangeKind
from sidecar.core.handoff import (
    AssignmentCallback,
    AssignmentChange,
    AssignmentNotice,
    HandoffCallback,
    HandoffKind,
    Subject,
)
from sidecar.core.placement import RELOCATION_HEADER, SIDECAR_HEADER, STAMP_HEADER
from sidecar.metrics import OTHER_GROUP, OTHER_TOPIC, SidecarMetrics
from sidecar.service.consume_context import (
    AppCallbacks,
    ConsumerMetrics,
    GroupOffsets,
    GroupStore,
    InstanceConsumer,
    ManagedTopics,
)
from sidecar.service.registry import TopicRegistry
from tests.support.ports import assert_adapter_offers
from tests.unit.service import fakes

TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)
DELIVERED = "sidecar_consumer_delivered_records_total"
SECONDS = "sidecar_handoff_callback_seconds"
FAILURES = "sidecar_handoff_callback_failures_total"


def _metrics(limits: MetricsSettings | None = None) -> tuple[ConsumerMetrics, SidecarMetrics]:
    sidecar = SidecarMetrics(CollectorRegistry(), limits)
    return ConsumerMetrics(sidecar), sidecar


def _value(metrics: SidecarMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _batch(tp: TopicPartition, *headers: Sequence[tuple[str, bytes | None]]) -> list[Any]:
    return [
        fakes.Record(tp.topic, tp.partition, offset, headers=list(h))
        for offset, h in enumerate(headers)
    ]


STAMPED = [(STAMP_HEADER, b"1 4 3")]
OLD_STAMP = [(SIDECAR_HEADER, b"sidecar-a")]
"""The separate headers sidecars before the stamp wrote: a sidecar's record too."""
UNSTAMPED: list[tuple[str, bytes | None]] = []
OTHER = [("traceparent", b"00-ab"), (RELOCATION_HEADER, b"1")]


# Delivered records -------------------------------------------------------------------------


def test_delivered_records_are_counted_per_partition() -> None:
    consumer, metrics = _metrics()
    records: list[ConsumedRecord] = _batch(TP0, STAMPED, STAMPED, STAMPED)
    consumer.delivered(TP0, records, managed=True)
    consumer.delivered(TP1, _batch(TP1, STAMPED), managed=True)
    consumer.delivered(TP0, _batch(TP0, STAMPED), managed=True)
    assert _value(metrics, DELIVERED, topic="orders", partition="0") == 4
    assert _value(metrics, DELIVERED, topic="orders", partition="1") == 1


def test_records_of_a_managed_topic_no_sidecar_stamped_are_counted_apart() -> None:
    consumer, metrics = _metrics()
    batch = _batch(TP0, STAMPED, UNSTAMPED, OLD_STAMP, OTHER)
    consumer.delivered(TP0, batch, managed=True)
    # A producer that bypassed the sidecars: no stamp in either format.
    without = _value(metrics, "sidecar_records_without_sidecar_headers_total", topic="orders")
    assert without == 2
    assert _value(metrics, DELIVERED, topic="orders", partition="0") == 4


def test_records_of_an_unmanaged_topic_are_not_expected_to_carry_a_stamp() -> None:
    consumer, metrics = _metrics()
    plain = TopicPartition("logs", 0)
    consumer.delivered(plain, _batch(plain, UNSTAMPED, UNSTAMPED), managed=False)
    assert _value(metrics, "sidecar_records_without_sidecar_headers_total", topic="logs") is None
    assert _value(metrics, DELIVERED, topic="logs", partition="0") == 2


def test_an_empty_delivery_moves_nothing_and_takes_no_topic_label() -> None:
    consumer, metrics = _metrics(MetricsSettings(max_topic_labels=1))
    consumer.delivered(TopicPartition("idle", 0), [], managed=True)
    assert _value(metrics, DELIVERED, topic="idle", partition="0") is None
    # The one label the bound allows is still free for a topic that delivers.
    consumer.delivered(TP0, _batch(TP0, STAMPED), managed=True)
    assert _value(metrics, DELIVERED, topic="orders", partition="0") == 1


def test_topics_and_groups_past_the_bounds_share_one_label() -> None:
    consumer, metrics = _metrics(MetricsSettings(max_topic_labels=1, max_group_labels=1))
    late = TopicPartition("late", 0)
    consumer.delivered(TP0, _batch(TP0, STAMPED), managed=True)
    consumer.delivered(late, _batch(late, STAMPED), managed=True)
    assert _value(metrics, DELIVERED, topic="orders", partition="0") == 1
    assert _value(metrics, DELIVERED, topic=OTHER_TOPIC, partition="0") == 1
    assert _value(metrics, DELIVERED, topic="late", partition="0") is None

    consumer.rebalanced("billing")
    consumer.rebalanced("run-1")
    consumer.rebalanced("run-2")
    rebalances = "sidecar_consumer_rebalances_total"
    assert _value(metrics, rebalances, group="billing") == 1
    assert _value(metrics, rebalances, group=OTHER_GROUP) == 2


# The gate ---------------------------------------------------------------------------------


def test_gated_partitions_are_a_gauge_that_goes_up_and_down() -> None:
    consumer, metrics = _metrics()
    consumer.gate_waiting("orders", "billing", 1)
    consumer.gate_waiting("orders", "billing", 2)
    consumer.gate_waiting("orders", "billing", -1)
    consumer.gate_waiting("orders", "audit", 1)
    gated = "sidecar_gated_partitions"
    assert _value(metrics, gated, topic="orders", group="billing") == 2
    assert _value(metrics, gated, topic="orders", group="audit") == 1


def test_a_gate_wait_is_observed_under_the_kind_of_change_it_waited_for() -> None:
    consumer, metrics = _metrics()
    consumer.gate_waited("orders", "billing", ChangeKind.EXPANSION, 0.25)
    consumer.gate_waited("orders", "billing", ChangeKind.EXPANSION, 0.5)
    consumer.gate_waited("orders", "billing", ChangeKind.SHRINK, 2.0)
    labels = {"topic": "orders", "group": "billing"}
    waits = "sidecar_gate_wait_seconds"
    assert _value(metrics, f"{waits}_count", **labels, reason="expansion") == 2
    assert _value(metrics, f"{waits}_sum", **labels, reason="expansion") == 0.75
    assert _value(metrics, f"{waits}_count", **labels, reason="shrink") == 1
    # Within the 0.25 s bucket: the first expansion wait only.
    assert _value(metrics, f"{waits}_bucket", **labels, reason="expansion", le="0.25") == 1


# Callbacks --------------------------------------------------------------------------------


def test_a_handoff_callback_is_timed_under_its_kind_and_a_failure_counted() -> None:
    consumer, metrics = _metrics()
    revoked = HandoffCallback(HandoffKind.KEYS_REVOKED, "billing", "i", Subject("orders", 0, 1))
    assigned = HandoffCallback(HandoffKind.KEYS_ASSIGNED, "billing", "i", Subject("orders", 1, 1))
    consumer.callback_done(revoked, 0.01, ok=True)
    consumer.callback_done(revoked, 0.02, ok=False)
    consumer.callback_done(assigned, 0.03, ok=True)
    assert _value(metrics, f"{SECONDS}_count", kind="keys_revoked") == 2
    assert _value(metrics, f"{SECONDS}_count", kind="keys_assigned") == 1
    assert _value(metrics, FAILURES, kind="keys_revoked") == 1
    assert _value(metrics, FAILURES, kind="keys_assigned") is None


def test_an_assignment_callback_is_timed_under_its_notice_kind() -> None:
    consumer, metrics = _metrics()
    notice = AssignmentNotice(AssignmentChange.PARTITIONS_ASSIGNED, (TP0, TP1))
    consumer.callback_done(AssignmentCallback("billing", "i", notice), 0.5, ok=False)
    assert _value(metrics, f"{SECONDS}_count", kind="partitions_assigned") == 1
    assert _value(metrics, f"{SECONDS}_sum", kind="partitions_assigned") == 0.5
    assert _value(metrics, FAILURES, kind="partitions_assigned") == 1


# Lag, rebalances, commits ---------------------------------------------------------------


def test_the_lag_gauge_holds_the_last_value_per_partition() -> None:
    consumer, metrics = _metrics()
    consumer.lag("billing", TP0, 120)
    consumer.lag("billing", TP0, 7)
    consumer.lag("billing", TP1, 0)
    lag = "sidecar_consumer_lag"
    assert _value(metrics, lag, group="billing", topic="orders", partition="0") == 7
    assert _value(metrics, lag, group="billing", topic="orders", partition="1") == 0


def test_rebalances_gone_through_and_asked_for_are_counted_apart() -> None:
    consumer, metrics = _metrics()
    consumer.rebalanced("billing")
    consumer.rebalance_requested("billing")
    consumer.rebalance_requested("billing")
    assert _value(metrics, "sidecar_consumer_rebalances_total", group="billing") == 1
    requests = "sidecar_consumer_rebalance_requests_total"
    assert _value(metrics, requests, group="billing") == 2


def test_a_commit_counts_once_per_partition_under_its_topic() -> None:
    consumer, metrics = _metrics()
    consumer.committed("billing", [TP0, TP1, TopicPartition("refunds", 3)])
    consumer.committed("billing", [])
    commits = "sidecar_consumer_commits_total"
    assert _value(metrics, commits, group="billing", topic="orders") == 2
    assert _value(metrics, commits, group="billing", topic="refunds") == 1


# The ports and the context ------------------------------------------------------------------


def _ports(
    registry: TopicRegistry, store: MetadataStore, kafka: KafkaGateway
) -> tuple[ManagedTopics, GroupStore, GroupOffsets]:
    # Checked by mypy: the adapters the sidecar wires in fill the ports.
    return registry, store, kafka


def _started_ports(
    consumer: GroupConsumer, callbacks: CallbackClient
) -> tuple[InstanceConsumer, AppCallbacks]:
    # Checked by mypy: the adapters the factories start fill the ports.
    return consumer, callbacks


def _methods(port: type) -> list[str]:
    return [
        name
        for name, member in vars(port).items()
        if not name.startswith("_") and inspect.isfunction(member)
    ]


@pytest.mark.parametrize(
    ("port", "adapter"),
    [(ManagedTopics, TopicRegistry), (GroupStore, MetadataStore), (GroupOffsets, KafkaGateway)],
)
def test_each_port_method_is_an_adapter_coroutine_with_the_same_parameters(
    port: type, adapter: type
) -> None:
    methods = _methods(port)
    assert methods  # the port declares what it needs
    for name in methods:
        wanted, actual = getattr(port, name), getattr(adapter, name)
        assert inspect.iscoroutinefunction(actual) == inspect.iscoroutinefunction(wanted), name
        assert list(inspect.signature(actual).parameters) == list(
            inspect.signature(wanted).parameters
        ), name


@pytest.mark.parametrize(
    ("port", "adapter"), [(InstanceConsumer, GroupConsumer), (AppCallbacks, CallbackClient)]
)
def test_the_started_adapters_offer_what_their_ports_name(port: type, adapter: type) -> None:
    assert_adapter_offers(port, adapter)


def test_the_fakes_of_the_ports_have_their_methods() -> None:
    for port, fake in (
        (ManagedTopics, fakes.Registry),
        (GroupStore, fakes.Store),
        (GroupOffsets, fakes.Offsets),
    ):
        for name in _methods(port):
            assert inspect.iscoroutinefunction(getattr(fake, name)), (fake, name)


def test_the_context_cannot_be_changed_once_built() -> None:
    context = fakes.Context().build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.sidecar_id = "other"  # type: ignore[misc]
    assert context.sidecar_id == "s"
