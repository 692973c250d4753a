"""Making topics managed: create, adopt, describe.

A created topic is created in Kafka first and then recorded in ZooKeeper. If the
second step fails, the Kafka topic exists unmanaged and a retry is told to adopt it:
nothing is half-managed, because only the ZooKeeper record makes a topic managed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.adapters.kafka import TopicExists
from sidecar.audit import events as audit_events
from sidecar.audit.emitter import AuditEmitter
from sidecar.core import names
from sidecar.core.errors import BadRequest, InvalidPartitionCount, TopicAlreadyManaged, UnknownTopic
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode
from sidecar.core.procedures import MAX_PARTITION_COUNT
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.metrics import SidecarMetrics
from sidecar.service.topic_ports import AdminKafka, AdminStore

MAX_REPLICATION_FACTOR = 2**15 - 1


@dataclass(frozen=True)
class LockHolding:
    """Who holds a topic's change lock, for what, and for how long so far."""

    holder: str
    purpose: str
    age_s: float


@dataclass(frozen=True)
class TopicDescription:
    state: TopicState
    lock: LockHolding | None


@dataclass(frozen=True)
class CreateTopic:
    name: str
    partitions: int
    replication_factor: int
    compacted: bool = False
    ordered_delivery: bool = True
    configs: Mapping[str, str] = field(default_factory=dict)
    """Kafka topic configs passed through (e.g. segment.ms), as REST Proxy v3 allows."""


class TopicAdmin:
    def __init__(
        self,
        store: AdminStore,
        kafka: AdminKafka,
        metrics: SidecarMetrics,
        audit: AuditEmitter | None = None,
    ) -> None:
        self.store = store
        self.kafka = kafka
        self.metrics = metrics
        self.audit = audit

    async def create(self, request: CreateTopic) -> TopicState:
        """Create the Kafka topic and manage it from generation 0.

        Raises BadRequest (name, replication factor), InvalidPartitionCount,
        TopicAlreadyManaged (managed already, or existing in Kafka: adopt it instead),
        KafkaBadRequest (Kafka refused the replication factor, a config, a policy).
        """
        names.topic_name(request.name, "name")
        if not 1 <= request.partitions <= MAX_PARTITION_COUNT:
            raise InvalidPartitionCount(
                f"partitions must be between 1 and {MAX_PARTITION_COUNT}, got {request.partitions}"
            )
        if not 1 <= request.replication_factor <= MAX_REPLICATION_FACTOR:
            # Kafka's field is an int16: a larger value could not even be sent.
            raise BadRequest(
                f"replication_factor must be between 1 and {MAX_REPLICATION_FACTOR}, "
                f"got {request.replication_factor}"
            )
        if "cleanup.policy" in request.configs:
            raise BadRequest("set cleanup.policy with the compacted field, not in configs")
        await self._refuse_managed(request.name)
        try:
            await self.kafka.create_topic(
                request.name,
                request.partitions,
                request.replication_factor,
                compacted=request.compacted,
                configs=request.configs,
            )
        except TopicExists as exc:
            raise TopicAlreadyManaged(
                f"topic {request.name} already exists in Kafka; adopt it instead"
            ) from exc
        config = TopicConfig(
            request.name,
            request.partitions,
            request.replication_factor,
            request.compacted,
            request.ordered_delivery,
        )
        state = await self._manage(config, request.partitions)
        self._done("create", request.name, request.partitions)
        return state

    async def adopt(
        self, name: str, *, compacted: bool = False, ordered_delivery: bool = True
    ) -> TopicState:
        """Manage an existing Kafka topic: generation 0 with ``U == N`` = its count.

        No key moves: Kafka's default partitioner is linear hashing with ``U == N``.
        Raises UnknownTopic, TopicAlreadyManaged.
        """
        names.topic_name(name)
        await self._refuse_managed(name)
        count = await self.kafka.partition_count(name)
        config = TopicConfig(name, count, 0, compacted, ordered_delivery)
        state = await self._manage(config, count)
        self._done("adopt", name, count)
        return state

    def _done(self, kind: str, topic: str, count: int) -> None:
        self.metrics.admin_operations.labels(kind, "done").inc()
        if self.audit is not None:
            self.audit.emit(
                audit_events.admin(
                    topic=topic, kind=kind, result="done", from_count=0, target_count=count
                )
            )

    async def describe(self, name: str) -> TopicDescription:
        """The topic's metadata, and who holds its change lock (and for how long)."""
        state = await self.store.read_topic(name)
        holder = await self.store.lock_holder(name)
        lock = None
        if holder is not None:
            lock = LockHolding(
                holder=holder.owner,
                purpose=holder.purpose,
                age_s=round(max(0.0, time.time() - holder.acquired_at), 3),
            )
        return TopicDescription(state, lock)

    async def _refuse_managed(self, name: str) -> None:
        try:
            await self.store.read_topic(name)
        except UnknownTopic:
            return
        raise TopicAlreadyManaged(f"topic {name} is already managed")

    async def _manage(self, config: TopicConfig, count: int) -> TopicState:
        # Generation 0 begins at offset 0 everywhere, stored, like every boundary, with
        # its partition's leader epoch (KIP-320).
        epochs = await self.kafka.leader_epochs(config.name, count)
        log = GenerationLog.start(count, [Boundary(0, epoch) for epoch in epochs])
        modes = (PartitionMode.READ_WRITE,) * count
        await self.store.create_topic(config, log.current, modes)
        return await self.store.read_topic(config.name)
