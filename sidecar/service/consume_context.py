"""What a consumer instance's components are given: the sidecar's parts they use.

The consume path talks to the topic registry (managed topics' runtimes), the group's
ZooKeeper records, the group's Kafka offsets, the audit emitter and the metrics, and
starts its adapters through the two factories here; nothing else of the sidecar.
Unit tests give fakes of each.

The consume domain's ports are all here, the adapters the factories start included
(``InstanceConsumer``: the group consumer; ``AppCallbacks``: the callback client): the
components speak these, and only ``sidecar.compose`` names the adapters that fill them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from sidecar.adapters.callbacks import CallbackMessage
from sidecar.adapters.group_consumer import Fetched, GroupConsumerOptions, RebalanceHandler
from sidecar.adapters.kafka import OffsetAndEpoch
from sidecar.audit.emitter import AuditEmitter
from sidecar.config import ConsumerSettings
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.generations import ChangeKind
from sidecar.core.handoff import HandoffCallback
from sidecar.core.placement import is_stamped
from sidecar.faults import FaultHooks
from sidecar.metrics import SidecarMetrics

if TYPE_CHECKING:
    from sidecar.service.registry import TopicRuntime


class ManagedTopics(Protocol):
    """The managed topics as this sidecar knows them (``TopicRegistry`` is one)."""

    @property
    def topics(self) -> Mapping[str, TopicRuntime]: ...

    async def runtime(self, topic: str) -> TopicRuntime | None: ...

    async def refresh(self, runtime: TopicRuntime) -> None: ...


class GroupStore(Protocol):
    """The consumer groups' records in ZooKeeper (``MetadataStore``)."""

    async def register_group(self, group: str) -> None: ...

    async def add_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None: ...

    async def remove_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None: ...

    async def waits(self, group: str, topic: str) -> dict[int, int]: ...

    async def acknowledge_revocation(
        self, group: str, topic: str, partition: int, generation: int
    ) -> None: ...

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]: ...


class GroupOffsets(Protocol):
    """The group's offsets in Kafka (``KafkaGateway``)."""

    async def committed_offsets(self, group: str, topic: str, count: int) -> dict[int, int]: ...

    async def log_start_offsets(self, topic: str, count: int) -> list[int]: ...

    async def epoch_end_offsets(
        self, topic: str, epochs: Mapping[int, int]
    ) -> Mapping[int, OffsetAndEpoch | None]: ...


class ConsumerMetrics:
    """The consume path's metrics, counted where the consume path knows them. Topics
    and groups are labelled through the registry's bounds (``SidecarMetrics``)."""

    def __init__(self, metrics: SidecarMetrics) -> None:
        self.metrics = metrics

    def delivered(
        self, tp: TopicPartition, records: Sequence[ConsumedRecord], managed: bool
    ) -> None:
        if not records:
            return
        metrics = self.metrics
        topic = metrics.topic_label(tp.topic, exists=True)
        metrics.delivered_records.labels(topic, str(tp.partition)).inc(len(records))
        if managed:
            without = sum(not is_stamped(r.headers) for r in records)
            if without:
                metrics.records_without_headers.labels(topic).inc(without)

    def gate_waiting(self, topic: str, group: str, delta: int) -> None:
        metrics = self.metrics
        metrics.gated_partitions.labels(
            metrics.topic_label(topic, exists=True), metrics.group_label(group)
        ).inc(delta)

    def gate_waited(self, topic: str, group: str, kind: ChangeKind, seconds: float) -> None:
        metrics = self.metrics
        metrics.gate_wait_seconds.labels(
            metrics.topic_label(topic, exists=True), metrics.group_label(group), kind.value
        ).observe(seconds)

    def callback_done(self, message: CallbackMessage, seconds: float, ok: bool) -> None:
        kind = message.kind if isinstance(message, HandoffCallback) else message.notice.kind
        self.metrics.callback_seconds.labels(kind.value).observe(seconds)
        if not ok:
            self.metrics.callback_failures.labels(kind.value).inc()

    def lag(self, group: str, tp: TopicPartition, records: int) -> None:
        metrics = self.metrics
        group_label, topic = metrics.group_label(group), metrics.topic_label(tp.topic, exists=True)
        metrics.consumer_lag.labels(group_label, topic, str(tp.partition)).set(records)

    def truncated(self, group: str, tp: TopicPartition, lost: int) -> None:
        metrics = self.metrics
        labels = (metrics.group_label(group), metrics.topic_label(tp.topic, exists=True))
        metrics.consumer_truncations.labels(*labels).inc()
        metrics.consumer_truncated_records.labels(*labels).inc(lost)

    def rebalanced(self, group: str) -> None:
        self.metrics.rebalances.labels(self.metrics.group_label(group)).inc()

    def rebalance_requested(self, group: str) -> None:
        self.metrics.rebalance_requests.labels(self.metrics.group_label(group)).inc()

    def committed(self, group: str, partitions: Sequence[TopicPartition]) -> None:
        metrics = self.metrics
        for tp in partitions:
            metrics.commits.labels(
                metrics.group_label(group), metrics.topic_label(tp.topic, exists=True)
            ).inc()


class InstanceConsumer(Protocol):
    """The instance's Kafka group consumer (``GroupConsumer``): its subscription or
    manual assignment, fetches, positions and seeks, and the group's commits."""

    def subscribe(
        self, topics: Sequence[str], pattern: str | None, handler: RebalanceHandler
    ) -> None: ...

    def assign(self, partitions: Iterable[TopicPartition]) -> None: ...

    def subscription(self) -> set[str]: ...

    def assignment(self) -> set[TopicPartition]: ...

    def incarnation(self) -> int: ...

    def request_rejoin(self) -> None: ...

    def pause(self, partitions: Iterable[TopicPartition]) -> None: ...

    def resume(self, partitions: Iterable[TopicPartition]) -> None: ...

    async def fetch(self, timeout_ms: int) -> Fetched: ...

    def highwater(self, tp: TopicPartition) -> int | None: ...

    async def commit(
        self, offsets: Mapping[TopicPartition, int], epochs: Mapping[TopicPartition, int | None]
    ) -> None: ...

    async def committed(self, tp: TopicPartition) -> int | None: ...

    async def committed_epochs(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndEpoch]: ...

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]: ...

    async def end_offset(self, tp: TopicPartition) -> int: ...

    def seek(self, tp: TopicPartition, offset: int) -> None: ...

    async def seek_to(self, partitions: Sequence[TopicPartition], *, beginning: bool) -> None: ...

    async def position(self, tp: TopicPartition) -> int: ...

    async def stop(self) -> None: ...


class AppCallbacks(Protocol):
    """Posts to the app's callback URL (``CallbackClient``): hand-off events and, if the
    app asked for them, assignment notices."""

    @property
    def timeout_s(self) -> float: ...

    async def post(
        self,
        message: CallbackMessage,
        *,
        within_s: float,
        still_needed: Callable[[], Awaitable[bool]] | None = None,
    ) -> str | None: ...

    async def close(self) -> None: ...


StartConsumer = Callable[[GroupConsumerOptions], Awaitable[InstanceConsumer]]
NewCallbackClient = Callable[[str, float], AppCallbacks]
"""A callback client for (url, timeout_s)."""


@dataclass(frozen=True)
class ConsumeContext:
    sidecar_id: str
    registry: ManagedTopics
    store: GroupStore
    offsets: GroupOffsets
    audit: AuditEmitter
    audit_sample_rate: float
    settings: ConsumerSettings
    metrics: ConsumerMetrics
    start_consumer: StartConsumer
    callback_client: NewCallbackClient
    faults: FaultHooks = field(default_factory=FaultHooks)

    def gated(self, runtime: TopicRuntime | None) -> bool:
        """Whether the topic's records go through the gate and the key hand-off: a
        managed topic with ordered delivery, unless the ungated fault is armed."""
        return (
            runtime is not None
            and runtime.state.config.ordered_delivery
            and not self.faults.ungated_delivery
        )
