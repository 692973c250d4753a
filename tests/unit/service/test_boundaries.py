"""The truncation check before a change or a retirement, over a Kafka that answers where
each leader epoch ends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from sidecar.adapters.kafka import KafkaGateway, OffsetAndEpoch
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.audit.emitter import AuditEmitter
from sidecar.core.errors import (
    BoundaryTruncated,
    KafkaUnavailable,
    NoTruncationToConfirm,
    UnknownTopic,
)
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.core.truncation import ConfirmedLoss
from sidecar.metrics import SidecarMetrics
from sidecar.service.boundaries import BoundaryCheck


class _EpochEnds:
    """Where each (partition, epoch) ends on the current leader."""

    def __init__(self, ends: dict[tuple[int, int], int | None]) -> None:
        self.ends = ends
        self.asked: list[dict[int, int]] = []

    async def epoch_end_offsets(
        self, topic: str, epochs: Mapping[int, int]
    ) -> dict[int, OffsetAndEpoch | None]:
        self.asked.append(dict(epochs))
        answers: dict[int, OffsetAndEpoch | None] = {}
        for partition, epoch in epochs.items():
            end = self.ends[(partition, epoch)]
            answers[partition] = None if end is None else OffsetAndEpoch(end, epoch)
        return answers


class _Audit:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def _log() -> GenerationLog:
    # Generation 1 moved keys at offset 10 of partition 0 (epoch 2) and 4 of partition 1.
    log = GenerationLog.start(2, [Boundary(0, 0), Boundary(0, 0)])
    return log.append(log.next_generation(3, [Boundary(10, 2), Boundary(4, 1), Boundary(0, 0)]))


class _Store:
    """The topic's generation log and its confirmed losses, as ZooKeeper keeps them."""

    def __init__(self, log: GenerationLog) -> None:
        self.log = log
        self.confirmed: set[ConfirmedLoss] = set()

    async def read_topic(self, topic: str) -> TopicState:
        if topic != "orders":
            raise UnknownTopic(f"topic {topic!r} is not managed")
        modes = (PartitionMode.READ_WRITE,) * self.log.current.undeleted_count
        return TopicState(TopicConfig(topic, 2, 3), self.log, modes)

    async def confirmed_truncations(self, topic: str) -> frozenset[ConfirmedLoss]:
        return frozenset(self.confirmed)

    async def confirm_truncations(self, topic: str, losses: list[ConfirmedLoss]) -> None:
        self.confirmed.update(losses)


def _check(
    ends: dict[tuple[int, int], int | None], store: _Store | None = None
) -> tuple[BoundaryCheck, SidecarMetrics, _Audit]:
    metrics = SidecarMetrics(CollectorRegistry())
    audit = _Audit()
    check = BoundaryCheck(
        cast(KafkaGateway, _EpochEnds(ends)),
        cast(MetadataStore, store or _Store(_log())),
        metrics,
        cast(AuditEmitter, audit),
    )
    return check, metrics, audit


def _gauge(metrics: SidecarMetrics, topic: str) -> float:
    return float(metrics.truncated_boundaries.labels(topic)._value.get())


async def test_intact_boundaries_let_the_change_proceed() -> None:
    check, metrics, audit = _check({(0, 2): 12, (1, 1): 4})
    await check.require_intact("orders", _log(), "a change")
    assert _gauge(metrics, "orders") == 0
    assert audit.events == []


async def test_a_boundary_the_log_no_longer_reaches_refuses_the_change() -> None:
    # Epoch 2 ended at 7 on the leader elected uncleanly: records 7..9 were lost.
    check, metrics, audit = _check({(0, 2): 7, (1, 1): 4})
    with pytest.raises(BoundaryTruncated) as refused:
        await check.require_intact("orders", _log(), "a change")
    assert (refused.value.http_status, refused.value.error_code) == (409, 40950)
    assert "a change of orders refused" in refused.value.message
    assert "partition 0 (generation 1, boundary 10, log reaches 7)" in refused.value.message
    assert _gauge(metrics, "orders") == 1
    assert audit.events == [
        {
            "type": "boundary_truncated",
            "topic": "orders",
            "generation": 1,
            "partition": 0,
            "boundary": 10,
            "leader_epoch": 2,
            "log_end": 7,
        }
    ]
    # Checked again (the next retirement round): refused again, audited once.
    with pytest.raises(BoundaryTruncated):
        await check.require_intact("orders", _log(), "retirement")
    assert len(audit.events) == 1
    assert _gauge(metrics, "orders") == 1


async def test_a_leader_that_knows_no_such_epoch_vouches_for_nothing() -> None:
    check, metrics, _ = _check({(0, 2): 12, (1, 1): None})
    with pytest.raises(BoundaryTruncated, match=r"partition 1 .*log reaches \?"):
        await check.require_intact("orders", _log(), "retirement")
    assert _gauge(metrics, "orders") == 1


async def test_a_confirmed_loss_no_longer_refuses_until_another_boundary_is_lost() -> None:
    store = _Store(_log())
    check, metrics, audit = _check({(0, 2): 7, (1, 1): 4}, store)
    with pytest.raises(BoundaryTruncated):
        await check.require_intact("orders", store.log, "a change")
    confirmed = await check.confirm("orders")
    assert [(lost.partition, lost.generation, lost.offset) for lost in confirmed] == [(0, 1, 10)]
    assert store.confirmed == {(1, 0, 10, 2)}
    assert _gauge(metrics, "orders") == 0
    assert audit.events[-1]["type"] == "truncation_confirmed"
    assert audit.events[-1]["boundaries"][0]["boundary"] == 10
    # Confirmed: the change goes on.
    await check.require_intact("orders", store.log, "a change")
    # Partition 1 loses its boundary too: refused again, for that one only.
    check.kafka = cast(KafkaGateway, _EpochEnds({(0, 2): 7, (1, 1): 2}))
    with pytest.raises(BoundaryTruncated) as refused:
        await check.require_intact("orders", store.log, "a change")
    assert "partition 1 (generation 1" in refused.value.message
    assert "partition 0" not in refused.value.message


async def test_confirming_without_a_loss_or_for_an_unknown_topic_writes_nothing() -> None:
    store = _Store(_log())
    check, _, audit = _check({(0, 2): 12, (1, 1): 4}, store)
    with pytest.raises(NoTruncationToConfirm) as nothing:
        await check.confirm("orders")
    assert (nothing.value.http_status, nothing.value.error_code) == (409, 40951)
    with pytest.raises(UnknownTopic):
        await check.confirm("payments")
    assert store.confirmed == set()
    assert audit.events == []
    # A loss confirmed already is nothing to confirm either.
    lost_check, _, _ = _check({(0, 2): 7, (1, 1): 4}, store)
    await lost_check.confirm("orders")
    with pytest.raises(NoTruncationToConfirm):
        await lost_check.confirm("orders")


async def test_the_check_at_start_reports_without_refusing_anything() -> None:
    """A truncation while no sidecar ran is reported when one starts (log, audit event,
    gauge), before any change; a topic whose check cannot be made is left to the next
    change's check, and the others are still checked."""

    class _Away(_EpochEnds):
        async def epoch_end_offsets(
            self, topic: str, epochs: Mapping[int, int]
        ) -> dict[int, OffsetAndEpoch | None]:
            if topic == "payments":
                raise KafkaUnavailable("no broker answered")
            return await super().epoch_end_offsets(topic, epochs)

    metrics = SidecarMetrics(CollectorRegistry())
    audit = _Audit()
    check = BoundaryCheck(
        cast(KafkaGateway, _Away({(0, 2): 7, (1, 1): 4})),
        cast(MetadataStore, _Store(_log())),
        metrics,
        cast(AuditEmitter, audit),
    )
    found = await check.report_lost({"payments": _log(), "orders": _log()})
    assert found == {"payments": None, "orders": 1}
    assert _gauge(metrics, "orders") == 1
    assert [event["partition"] for event in audit.events] == [0]
