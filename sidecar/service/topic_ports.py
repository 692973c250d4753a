"""What making topics managed, following them and writing to them need of ZooKeeper and
Kafka: the ports the topic admin (``service.admin``), the topic registry
(``service.registry``) and the produce service (``service.produce``) are given.

``MetadataStore`` and ``KafkaGateway`` are the production ones; the unit tests give
fakes. Each port names only what its service calls.

One module per domain, as ``service.change_ports`` for a change and its retirement and
``service.consume_context`` for the consume path: the admin writes a managed topic's
first record and the registry follows the records from then on, so what a topic's life
outside a change touches is read here. The registry's Kafka side has no port yet: its
``KafkaGateway`` is handed on whole (to the audit emitter it builds, and to
``service.topics``, which reaches Kafka through it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sidecar.adapters.kafka import OutgoingKafkaRecord, PartitionInfo, SendFailed, SentRecord
from sidecar.adapters.zookeeper import LockHolder
from sidecar.core.generations import Generation, PartitionMode
from sidecar.core.participant import SessionState
from sidecar.core.procedures import TransactionalId
from sidecar.core.topics import TopicConfig, TopicState


class AdminStore(Protocol):
    """A managed topic's record in ZooKeeper: created, read, and its change lock's holder."""

    async def create_topic(
        self, config: TopicConfig, generation0: Generation, modes: tuple[PartitionMode, ...]
    ) -> None: ...

    async def read_topic(
        self, topic: str, changed: Callable[[], None] | None = None
    ) -> TopicState: ...

    async def lock_holder(self, topic: str) -> LockHolder | None: ...


class AdminKafka(Protocol):
    """What making a topic managed asks of Kafka: the topic created or counted, and its
    partitions' leader epochs (generation 0's boundaries)."""

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        *,
        compacted: bool,
        configs: Mapping[str, str] | None = None,
    ) -> None: ...

    async def partition_count(self, topic: str) -> int: ...

    async def leader_epochs(self, topic: str, count: int) -> list[int | None]: ...


class ProducerRegistration(Protocol):
    """What the writer's incarnations (``service/incarnations.py``) keep in ZooKeeper:
    this sidecar's registration naming its producers' ids, and the ids retired."""

    async def register_sidecar(
        self,
        sidecar_id: str,
        info: dict[str, Any],
        transactional_ids: Sequence[TransactionalId] = (),
    ) -> None: ...

    def prepare_registration(
        self, sidecar_id: str, info: dict[str, Any], transactional_ids: Sequence[TransactionalId]
    ) -> None: ...

    async def forget_producers(self, transactional_ids: tuple[TransactionalId, ...]) -> None: ...


class RegistryStore(ProducerRegistration, Protocol):
    """What the registry keeps up with in ZooKeeper: its session, the managed topics and
    their watches, and its acks of a change's barrier; and, for the incarnations it
    holds, this sidecar's registration."""

    async def start(self, timeout: float = 15.0) -> None: ...  # noqa: ASYNC109

    async def stop(self) -> None: ...

    @property
    def session_state(self) -> SessionState: ...

    def add_session_listener(self, callback: Callable[[SessionState], None]) -> None: ...

    async def list_topics(self) -> list[str]: ...

    async def read_topic(
        self, topic: str, changed: Callable[[], None] | None = None
    ) -> TopicState: ...

    def watch_topic_list(self, callback: Callable[[], None]) -> None: ...

    async def ack_barrier(
        self, topic: str, generation: int, sidecar_id: str, acked: Mapping[int, int]
    ) -> None: ...


class ProduceKafka(Protocol):
    """What the produce service asks of Kafka itself, for unmanaged topics: the
    partition count to route keyed records by (a plain producer's, from its metadata),
    and idempotent sends (managed topics go through the registry's transactional
    writer)."""

    async def routing_partition_count(self, topic: str) -> int: ...

    async def send_batch(
        self, topic: str, records: Sequence[OutgoingKafkaRecord]
    ) -> list[SentRecord | SendFailed]: ...


class DirectoryKafka(Protocol):
    """What the topic directory (the REST Proxy's discovery routes, and the partition
    checks of a produce to an unmanaged topic) asks of Kafka."""

    async def list_topics(self) -> list[str]: ...

    async def broker_ids(self) -> list[int]: ...

    async def cluster_id(self) -> str: ...

    async def topic_configs(self, topic: str) -> dict[str, str | None]: ...

    async def describe_partitions(self, topic: str) -> list[PartitionInfo]: ...

    async def partition_count(self, topic: str) -> int: ...
