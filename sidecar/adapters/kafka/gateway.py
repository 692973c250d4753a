"""``KafkaGateway``, the sidecar's one connection to Kafka: a front class that starts and
stops the clients and hands every other call to one of its two components, which share
the clients (``clients.ConnectionState``): ``admin.KafkaAdmin`` (topics, metadata,
offsets, leader epochs, group offsets) and ``writes.KafkaWrites`` (sends, fencing)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from sidecar.adapters.kafka.admin import KafkaAdmin, OffsetAndEpoch, PartitionInfo
from sidecar.adapters.kafka.clients import ConnectionState, _Clients, _close_all, client_settings
from sidecar.adapters.kafka.errors import _NOT_AUTHORIZED, SendFailed, _principal_refused
from sidecar.adapters.kafka.writes import Header, KafkaWrites, OutgoingKafkaRecord, SentRecord
from sidecar.adapters.kafka_security import diagnose
from sidecar.adapters.offset_fetch import check_admin_client
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaUnavailable

# One logger for the whole gateway: every module of the package logs as
# ``sidecar.adapters.kafka``.
_log = logging.getLogger(__package__)


class KafkaGateway:
    """The sidecar's one connection to Kafka. ``start`` before use, ``stop`` at the end.

    Each method past the life cycle is a component's, documented there: sends and
    fencing are ``KafkaWrites``', the rest ``KafkaAdmin``'s."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._timeout_s = settings.request_timeout_ms / 1000
        self._connection = ConnectionState()
        self._admin = KafkaAdmin(settings, self._connection)
        self._writes = KafkaWrites(settings, self._connection, self._admin)

    # Life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect all clients. Raises KafkaUnavailable if the cluster does not answer
        within the request timeout."""
        common, producer_extra = client_settings(self._settings)
        producer = AIOKafkaProducer(**common, **producer_extra, acks="all", enable_idempotence=True)
        admin = AIOKafkaAdminClient(**common)
        check_admin_client(admin)
        consumer = AIOKafkaConsumer(
            **common,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                await producer.start()
                await admin.start()
                await consumer.start()
        except (KafkaError, OSError, TimeoutError) as exc:
            await _close_all(producer, admin, consumer)
            # aiokafka says only "unable to bootstrap": one connection of our own tells a
            # refused credential or certificate from a cluster that is away.
            if isinstance(exc, _NOT_AUTHORIZED):
                raise _principal_refused(self._settings, exc) from exc
            refused = await diagnose(self._settings)
            if refused is not None:
                raise refused from exc
            reason = str(exc) or f"no answer within {self._timeout_s:g} s"
            raise KafkaUnavailable(
                f"cannot reach Kafka at {self._settings.bootstrap_servers}: {reason}"
            ) from exc
        self._connection.clients = _Clients(producer, admin, consumer)

    async def stop(self) -> None:
        """Deliver what is queued (for up to the request timeout), then close everything."""
        self._connection.stopped = True
        clients, self._connection.clients = self._connection.clients, None
        if clients is None:
            return
        try:
            # The idempotent producer retries forever, so its stop() (which flushes)
            # could wait forever for an unreachable cluster.
            await asyncio.wait_for(clients.producer.stop(), self._timeout_s)
        except (KafkaError, TimeoutError) as exc:
            _log.warning("Kafka producer did not stop cleanly, records may be lost: %s", exc)
        await _close_all(clients.admin, clients.consumer)

    # Producing: KafkaWrites ---------------------------------------------------------------

    async def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
    ) -> SentRecord:
        return await self._writes.send(topic, partition, key, value, headers)

    async def send_batch(
        self, topic: str, records: Sequence[OutgoingKafkaRecord]
    ) -> list[SentRecord | SendFailed]:
        return await self._writes.send_batch(topic, records)

    async def routing_partition_count(self, topic: str) -> int:
        return await self._writes.routing_partition_count(topic)

    # ``timeout`` bounds a polling loop over shared metadata; nothing to cancel.
    async def wait_for_partition_count(
        self,
        topic: str,
        count: int,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        await self._writes.wait_for_partition_count(topic, count, timeout)

    async def fence_producer(self, transactional_id: str) -> None:
        await self._writes.fence_producer(transactional_id)

    # Topics: KafkaAdmin -------------------------------------------------------------------

    async def topic_exists(self, topic: str) -> bool:
        return await self._admin.topic_exists(topic)

    async def partition_count(self, topic: str) -> int:
        return await self._admin.partition_count(topic)

    async def existing_partition_count(self, topic: str) -> int:
        return await self._admin.existing_partition_count(topic)

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        *,
        compacted: bool,
        configs: Mapping[str, str] | None = None,
    ) -> None:
        await self._admin.create_topic(
            topic, partitions, replication_factor, compacted=compacted, configs=configs
        )

    async def create_partitions(self, topic: str, total_count: int) -> int:
        return await self._admin.create_partitions(topic, total_count)

    # Discovery (REST Proxy v2's read-only topic and broker routes): KafkaAdmin ---------

    async def list_topics(self) -> list[str]:
        return await self._admin.list_topics()

    async def describe_partitions(self, topic: str) -> list[PartitionInfo]:
        return await self._admin.describe_partitions(topic)

    async def topic_configs(self, topic: str) -> dict[str, str | None]:
        return await self._admin.topic_configs(topic)

    async def broker_ids(self) -> list[int]:
        return await self._admin.broker_ids()

    async def cluster_id(self) -> str:
        return await self._admin.cluster_id()

    # Offsets: KafkaAdmin ------------------------------------------------------------------

    async def end_offsets(self, topic: str, count: int) -> list[int]:
        return await self._admin.end_offsets(topic, count)

    async def stable_offsets(self, topic: str, count: int) -> list[OffsetAndEpoch]:
        return await self._admin.stable_offsets(topic, count)

    async def epoch_end_offsets(
        self, topic: str, epochs: Mapping[int, int]
    ) -> dict[int, OffsetAndEpoch | None]:
        return await self._admin.epoch_end_offsets(topic, epochs)

    async def high_watermarks(self, topic: str, count: int) -> list[int]:
        return await self._admin.high_watermarks(topic, count)

    async def log_start_offsets(self, topic: str, count: int) -> list[int]:
        return await self._admin.log_start_offsets(topic, count)

    async def leader_epochs(self, topic: str, count: int) -> list[int | None]:
        return await self._admin.leader_epochs(topic, count)

    async def delete_records(self, topic: str, before: Mapping[int, int]) -> dict[int, int]:
        return await self._admin.delete_records(topic, before)

    async def committed_offsets(self, group: str, topic: str, count: int) -> dict[int, int]:
        return await self._admin.committed_offsets(group, topic, count)
