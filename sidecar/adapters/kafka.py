"""Everything the sidecar asks of Kafka: one asyncio adapter over aiokafka.

Three long-lived clients: an idempotent producer (``acks="all"``, so a retry neither
duplicates nor reorders a record within a partition) for unmanaged topics and the
audit topic, an admin client, and a consumer without a group for offset queries. It
reads with ``read_committed``, so the end offsets it reports are last stable offsets:
what a change's boundaries are made of once every transaction writing there has ended.
Managed topics are written through ``sidecar.adapters.transactions``. aiokafka errors
come out as the ``sidecar.core.errors`` hierarchy; a send that fails comes out as
``SendFailed``, which says whether the record may have been appended.

Metadata of one topic is read with ``allow_auto_topic_creation=False``: aiokafka's own
metadata requests ask for auto-creation (``protocol/metadata.py``, ``MetadataRequest``
defaults it to True), so on a broker with ``auto.create.topics.enable`` merely asking
about a topic would create it.

Leader epochs (KIP-320) come from the request versions that carry them, defined in
``sidecar.adapters.kafka_protocol`` and sent through the producer's aiokafka client:
the gateway's own Metadata requests are v7, end offsets are read with ListOffsets v4+
(each from its partition's leader, fenced by the leader epoch the metadata named, and
answered with the leader's epoch), and ``epoch_end_offsets`` asks OffsetForLeaderEpoch
v3. A cluster older than Kafka 2.1 cannot answer them and is refused (KafkaFailure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    BrokerResponseError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    PolicyViolationError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.errors import ProducerFenced as KafkaProducerFenced
from aiokafka.producer import sender as aiokafka_sender

from sidecar.adapters.kafka_protocol import (
    NO_EPOCH,
    EpochListOffsetsRequest,
    EpochMetadataRequest,
    OffsetForLeaderEpochRequest,
)
from sidecar.adapters.kafka_security import (
    coerced_client_options,
    diagnose,
    security_arguments,
)
from sidecar.adapters.offset_fetch import check_admin_client
from sidecar.config import ConfigError, KafkaSettings
from sidecar.core.errors import (
    InvalidPartitionCount,
    KafkaAuthenticationFailed,
    KafkaBadRequest,
    KafkaFailure,
    KafkaNotAuthorized,
    KafkaUnavailable,
    ProducerFenced,
    ShuttingDown,
    SidecarError,
    UnknownPartition,
    UnknownTopic,
)

_log = logging.getLogger(__name__)
_ALREADY_HAS = re.compile(r"already has (\d+) partition")

Header = tuple[str, bytes | None]

# Settings every aiokafka client accepts (they configure AIOKafkaClient's connections);
# any other key of ``kafka.client`` tunes the producer only. Security settings come from
# ``kafka.security`` (``sidecar.adapters.kafka_security``), never from ``kafka.client``.
_CONNECTION_KEYS = frozenset(
    {
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "connections_max_idle_ms",
        "retry_backoff_ms",
        "metadata_max_age_ms",
    }
)
FENCED_ERRORS = (KafkaProducerFenced, TransactionalIdAuthorizationFailed)
"""After these a transactional id belongs to another producer (or to none): never retried."""
_UNKNOWN_TOPIC_ERRNO = UnknownTopicOrPartitionError.errno
FALLBACK_CLUSTER_ID = "kafka-cluster"
"""The cluster id answered when Kafka reports none (brokers before 0.10.1)."""


@dataclass(frozen=True, slots=True)
class SentRecord:
    """Where a record landed. Its position names it; the timestamp is what Kafka stamped."""

    partition: int
    offset: int
    timestamp_ms: int | None = field(default=None, compare=False)
    """CreateTime or LogAppendTime, as the producer reports it (not part of equality)."""


@dataclass(frozen=True, slots=True)
class OutgoingKafkaRecord:
    partition: int
    key: bytes | None
    value: bytes | None
    """None is a tombstone."""
    headers: Sequence[Header]
    timestamp_ms: int | None = None
    """None: the producer stamps the record when it is queued."""


class SendFailed(Exception):
    """A send known to have failed (``maybe_appended`` False) or whose outcome is unknown.

    ``maybe_appended`` is True when the request may have reached the broker (a timeout,
    a lost connection): the record may still be appended, later, in order. ``retriable``
    is False when Kafka refused the record itself (too large, not authorised).
    """

    def __init__(
        self,
        message: str,
        *,
        maybe_appended: bool,
        retriable: bool | None = None,
        not_authorized: bool = False,
        identity_refused: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.maybe_appended = maybe_appended
        self.retriable = maybe_appended if retriable is None else retriable
        """Sending the record again is what the client should do (nothing was refused)."""
        self.not_authorized = not_authorized
        """Kafka's ACLs refused this sidecar's principal the topic (nothing was appended)."""
        self.identity_refused = identity_refused
        """Kafka refused this sidecar's credentials or certificate when it connected
        again (nothing was appended); ``message`` names the setting."""


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """Where a partition lives: its leader (-1: none now), replicas and in-sync replicas."""

    partition: int
    leader: int
    replicas: tuple[int, ...]
    in_sync: tuple[int, ...]
    leader_epoch: int | None = None
    """The leader's epoch (KIP-320); None where Kafka names none."""


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    """An offset and the leader epoch Kafka answered with it (None: Kafka named none)."""

    offset: int
    leader_epoch: int | None


class TopicExists(Exception):
    """create_topic found the topic already there."""


@dataclass(frozen=True, slots=True)
class _Clients:
    producer: Any
    admin: Any
    consumer: Any


class KafkaGateway:
    """The sidecar's one connection to Kafka. ``start`` before use, ``stop`` at the end."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._timeout_s = settings.request_timeout_ms / 1000
        self._clients: _Clients | None = None
        self._stopped = False
        self._cluster_id: str | None = None

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
        self._clients = _Clients(producer, admin, consumer)

    async def stop(self) -> None:
        """Deliver what is queued (for up to the request timeout), then close everything."""
        self._stopped = True
        clients, self._clients = self._clients, None
        if clients is None:
            return
        try:
            # The idempotent producer retries forever, so its stop() (which flushes)
            # could wait forever for an unreachable cluster.
            await asyncio.wait_for(clients.producer.stop(), self._timeout_s)
        except (KafkaError, TimeoutError) as exc:
            _log.warning("Kafka producer did not stop cleanly, records may be lost: %s", exc)
        await _close_all(clients.admin, clients.consumer)

    # Producing ----------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
    ) -> SentRecord:
        """Append one record to ``partition`` (``value`` None: a tombstone).

        Raises UnknownTopic, UnknownPartition (not in metadata within the request
        timeout), SendFailed.
        """
        await self._await_partition(topic, partition)
        record = OutgoingKafkaRecord(partition, key, value, headers)
        outcome = await self._delivered(await self._enqueue(topic, record))
        if isinstance(outcome, SendFailed):
            raise outcome
        return outcome

    async def send_batch(
        self, topic: str, records: Sequence[OutgoingKafkaRecord]
    ) -> list[SentRecord | SendFailed]:
        """Send ``records`` in order and wait for all of them; one outcome per record.

        Never raises for a record: a topic or partition missing from metadata fails
        every record with ``maybe_appended`` False.
        """
        if not records:
            return []
        try:
            await self._await_partition(topic, max(record.partition for record in records))
        except SidecarError as exc:
            refused = isinstance(exc, KafkaNotAuthorized)
            return [
                SendFailed(exc.message, maybe_appended=False, not_authorized=refused)
                for _ in records
            ]
        # Enqueued one after the other, so the accumulator keeps the request's order.
        deliveries = [await self._enqueue(topic, record) for record in records]
        # One wait for the whole batch: a task and a timer per record cost more than
        # the rest of the produce path at small record sizes (see bench/README.md).
        pending = {d for d in deliveries if not isinstance(d, SendFailed)}
        if pending:
            await asyncio.wait(pending, timeout=self._timeout_s)
        return [self._outcome(d) for d in deliveries]

    # ``timeout`` bounds a polling loop over shared metadata; nothing to cancel.
    async def wait_for_partition_count(
        self,
        topic: str,
        count: int,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        """Wait until the producer's metadata shows at least ``count`` partitions.

        Raises KafkaUnavailable on timeout.
        """
        await await_partition_count(
            self._require().producer.client,
            topic,
            count,
            timeout,
            backoff_s=self._settings.retry_backoff_s,
        )

    async def _await_partition(self, topic: str, partition: int) -> None:
        client = self._require().producer.client
        if client.cluster.partitions_for_topic(topic) is None:
            # Asked here first: the producer's metadata request could auto-create it.
            await self.partition_count(topic)
            client.add_topic(topic)
        try:
            await self.wait_for_partition_count(topic, partition + 1, self._timeout_s)
        except KafkaUnavailable as exc:
            raise UnknownPartition(f"partition {partition} of {topic} does not exist") from exc

    async def _enqueue(
        self, topic: str, record: OutgoingKafkaRecord
    ) -> asyncio.Future[Any] | SendFailed:
        return await enqueue(self._require().producer, topic, record)

    async def _delivered(
        self, delivery: asyncio.Future[Any] | SendFailed
    ) -> SentRecord | SendFailed:
        if isinstance(delivery, SendFailed):
            return delivery
        # asyncio.wait, not wait_for: cancelling the future would not stop the send.
        await asyncio.wait({delivery}, timeout=self._timeout_s)
        return self._outcome(delivery)

    def _outcome(self, delivery: asyncio.Future[Any] | SendFailed) -> SentRecord | SendFailed:
        """What became of a send, once it is done or its wait timed out."""
        if isinstance(delivery, SendFailed):
            return delivery
        if not delivery.done():
            delivery.add_done_callback(_discard_outcome)
            return SendFailed(
                f"no acknowledgement within {self._timeout_s:g} s", maybe_appended=True
            )
        exc = delivery.exception()
        if exc is None:
            return sent_record(delivery.result())
        # What reaches the future (aiokafka 0.14 producer/sender.py,
        # SendProduceReqHandler.handle_response and _can_retry): with idempotence a
        # batch is retried while its error is `retriable`, so a BrokerResponseError
        # with retriable=False (MessageSizeTooLarge, RecordListTooLarge,
        # TopicAuthorizationFailed, InvalidRequiredAcks, UnknownError for codes
        # aiokafka lacks, ...) is the broker refusing the batch. Anything else (a batch
        # expired without a leader in message_accumulator.drain_by_nodes, a connection
        # error) may follow an attempt that reached the broker.
        refused = isinstance(exc, BrokerResponseError) and not exc.retriable
        return SendFailed(
            str(exc), maybe_appended=not refused, not_authorized=isinstance(exc, _NOT_AUTHORIZED)
        )

    async def fence_producer(self, transactional_id: str) -> None:
        """Fence whoever writes with ``transactional_id``: initialise it (which bumps its
        epoch, and completes or aborts its open transaction before it answers), then
        close again. Raises KafkaUnavailable."""
        began = time.monotonic()
        try:
            producer = await start_transactional_producer(self._settings, transactional_id)
        except ProducerFenced:
            return  # initialised by someone after us: fenced all the same
        try:
            await asyncio.wait_for(producer.stop(), self._timeout_s)
        except (KafkaError, TimeoutError) as exc:
            _log.info("closing the fencing producer of %s: %s", transactional_id, exc)
        _log.info("fenced %s in %.0f ms", transactional_id, 1000 * (time.monotonic() - began))

    # Topics -------------------------------------------------------------------------------

    async def topic_exists(self, topic: str) -> bool:
        """Raises KafkaUnavailable, KafkaFailure."""
        return await self._partition_count_or_none(topic) is not None

    async def partition_count(self, topic: str) -> int:
        """Raises UnknownTopic, KafkaUnavailable, KafkaFailure."""
        count = await self._partition_count_or_none(topic)
        if count is None:
            raise UnknownTopic(f"topic {topic} does not exist")
        return count

    async def existing_partition_count(self, topic: str) -> int:
        """The partition count of a topic Kafka just reported as existing (TopicExists).

        Another process may have created it a moment ago, and the broker this metadata
        request goes to may not list it yet: asked again until it does, for up to the
        request timeout. Raises KafkaUnavailable after that, KafkaFailure.
        """
        deadline = time.monotonic() + self._timeout_s
        while (count := await self._partition_count_or_none(topic)) is None:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"topic {topic} exists but metadata does not show it")
            await asyncio.sleep(self._settings.retry_backoff_s)
        return count

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        *,
        compacted: bool,
        configs: Mapping[str, str] | None = None,
    ) -> None:
        """Create ``topic`` (with extra topic ``configs``) and wait until metadata shows it.

        Raises TopicExists, InvalidPartitionCount, KafkaBadRequest (a replication factor,
        config or policy Kafka refuses, with Kafka's message), KafkaUnavailable,
        KafkaFailure.
        """
        configs = dict(configs or {}) | ({"cleanup.policy": "compact"} if compacted else {})
        new_topic = NewTopic(topic, partitions, replication_factor, topic_configs=configs)
        # Not retried: a retry after a timeout could report our own topic as existing.
        try:
            response = await self._require().admin.create_topics([new_topic])
        except KafkaError as exc:
            raise _translated(exc, f"creating topic {topic}") from exc
        for name, code, *rest in response.topic_errors:
            if code == TopicAlreadyExistsError.errno:
                raise TopicExists(f"topic {name} already exists")
            if code == InvalidPartitionsError.errno:
                raise InvalidPartitionCount(f"cannot create {topic}: {rest[0] if rest else ''}")
            if code:
                error = _error_for_code(code, rest[0] if rest else "")
                raise _translated(error, f"creating topic {topic}") from error
        deadline = time.monotonic() + self._timeout_s
        # Every broker, not just one: the next metadata request may go to any of them,
        # and one that has not heard of the topic yet would call it unknown.
        while not await self._known_by_every_broker(topic):
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"topic {topic} was created but metadata does not show it")
            await asyncio.sleep(self._settings.retry_backoff_s)

    async def _known_by_every_broker(self, topic: str) -> bool:
        client = self._require().producer.client
        request = EpochMetadataRequest([topic])
        for broker in client.cluster.brokers():
            try:
                response = await _send(client, broker.nodeId, request)
            except KafkaError:
                return False
            if not any(
                name == topic and error_code == 0 for error_code, name, *_ in response.topics
            ):
                return False
        return True

    async def create_partitions(self, topic: str, total_count: int) -> int:
        """Make ``topic`` have at least ``total_count`` partitions; returns the count now.

        Idempotent: a topic already that large is left alone. Raises UnknownTopic,
        InvalidPartitionCount, KafkaUnavailable, KafkaFailure.
        """
        current = await self.partition_count(topic)
        if current >= total_count:
            return current
        request = {topic: NewPartitions(total_count=total_count)}
        try:
            await self._require().admin.create_partitions(request)
        except InvalidPartitionsError as exc:
            # Someone else grew it between our read and our request, or the metadata we
            # read lags the controller (seen right after a creation). The controller's
            # own count, in its message, is the authoritative one.
            said = _ALREADY_HAS.search(str(exc))
            if said is not None and int(said.group(1)) >= total_count:
                return int(said.group(1))
            current = await self.partition_count(topic)
            if current >= total_count:
                return current
            raise InvalidPartitionCount(str(exc)) from exc
        except UnknownTopicOrPartitionError as exc:
            raise UnknownTopic(f"topic {topic} does not exist") from exc
        except KafkaError as exc:
            raise _translated(exc, f"creating partitions of {topic}") from exc
        return total_count

    async def _partition_count_or_none(self, topic: str) -> int | None:
        response = await self._retrying(
            lambda: self._ask_any(EpochMetadataRequest([topic])), f"reading metadata of {topic}"
        )
        for error_code, name, *_, partitions in response.topics:
            if name != topic:
                continue
            if error_code == _UNKNOWN_TOPIC_ERRNO:
                return None
            if error_code:
                error = _error_for_code(error_code, f"metadata of {topic}")
                raise _translated(error, f"reading metadata of {topic}") from error
            return len(partitions)
        return None

    # Discovery (REST Proxy v2's read-only topic and broker routes) ---------------------

    async def list_topics(self) -> list[str]:
        """Names of the cluster's topics, sorted, internal ones left out (as REST Proxy
        v2's ``GET /topics``). Raises KafkaUnavailable, KafkaFailure."""
        metadata = await self._metadata(None, "listing topics")
        return sorted(
            t["topic"] for t in metadata["topics"] if t["error_code"] == 0 and not t["is_internal"]
        )

    async def describe_partitions(self, topic: str) -> list[PartitionInfo]:
        """``topic``'s partitions in order, each with its leader and replicas.

        Raises UnknownTopic, KafkaUnavailable, KafkaFailure.
        """
        metadata = await self._metadata([topic], f"reading metadata of {topic}")
        for entry in metadata["topics"]:
            if entry["topic"] != topic:
                continue
            if entry["error_code"] == _UNKNOWN_TOPIC_ERRNO:
                break
            if entry["error_code"]:
                error = _error_for_code(entry["error_code"], f"metadata of {topic}")
                raise _translated(error, f"reading metadata of {topic}") from error
            return sorted(
                (
                    PartitionInfo(
                        partition=int(p["partition"]),
                        leader=int(p["leader"]),
                        replicas=tuple(int(r) for r in p["replicas"]),
                        in_sync=tuple(int(r) for r in p["isr"]),
                        leader_epoch=_epoch(p["leader_epoch"]),
                    )
                    for p in entry["partitions"]
                ),
                key=lambda info: info.partition,
            )
        raise UnknownTopic(f"topic {topic} does not exist")

    async def topic_configs(self, topic: str) -> dict[str, str | None]:
        """``topic``'s configs as Kafka reports them; a sensitive value is None.

        Raises UnknownTopic, KafkaUnavailable, KafkaFailure.
        """
        resource = ConfigResource(ConfigResourceType.TOPIC, topic)
        responses = await self._retrying(
            lambda: self._require().admin.describe_configs([resource]),
            f"reading configs of {topic}",
        )
        for response in responses:
            for entry in response.to_object()["resources"]:
                if entry["error_code"] == _UNKNOWN_TOPIC_ERRNO:
                    raise UnknownTopic(f"topic {topic} does not exist")
                if entry["error_code"]:
                    error = _error_for_code(entry["error_code"], entry["error_message"] or "")
                    raise _translated(error, f"reading configs of {topic}") from error
                return {
                    config["config_names"]: None
                    if config["is_sensitive"]
                    else config["config_value"]
                    for config in entry["config_entries"]
                }
        raise KafkaFailure(f"reading configs of {topic}: Kafka answered no resource")

    async def broker_ids(self) -> list[int]:
        """Ids of the cluster's brokers, sorted. Raises KafkaUnavailable, KafkaFailure."""
        metadata = await self._metadata([], "listing brokers")
        return sorted(int(broker["node_id"]) for broker in metadata["brokers"])

    async def cluster_id(self) -> str:
        """The id Kafka's metadata reports for the cluster (``FALLBACK_CLUSTER_ID`` from a
        broker too old to report one). Asked once, then remembered: it never changes.

        Raises KafkaUnavailable, KafkaFailure.
        """
        if self._cluster_id is None:
            metadata = await self._metadata([], "reading the cluster id")
            self._cluster_id = metadata.get("cluster_id") or FALLBACK_CLUSTER_ID
        return self._cluster_id

    async def _metadata(self, topics: list[str] | None, what: str) -> dict[str, Any]:
        """A Metadata answer (``topics`` None: every topic), never auto-creating one."""
        response = await self._retrying(lambda: self._ask_any(EpochMetadataRequest(topics)), what)
        return response.to_object()  # type: ignore[no-any-return]

    async def _ask_any(self, request: Any) -> Any:
        """Send ``request`` to any broker the producer's client knows."""
        client = self._require().producer.client
        node = client.get_random_node()
        if node is None:
            raise KafkaUnavailable("no broker known")
        return await _send(client, node, request)

    async def _leaders(self, topic: str, count: int) -> dict[int, tuple[int, int]]:
        """Partition -> (leader node, leader epoch) of partitions 0..count-1, from one
        Metadata answer. Raises _LeaderUnknown (retriable) while a partition is missing
        or has no leader, KafkaFailure; run it under ``_retrying``."""
        metadata = (await self._ask_any(EpochMetadataRequest([topic]))).to_object()
        leaders: dict[int, tuple[int, int]] = {}
        for entry in metadata["topics"]:
            if entry["topic"] != topic:
                continue
            if entry["error_code"] and entry["error_code"] != _UNKNOWN_TOPIC_ERRNO:
                error = _error_for_code(entry["error_code"], f"metadata of {topic}")
                raise _translated(error, f"reading metadata of {topic}") from error
            for p in entry["partitions"]:
                if p["partition"] < count and p["leader"] >= 0 and not p["error_code"]:
                    leaders[p["partition"]] = (int(p["leader"]), int(p["leader_epoch"]))
        missing = sorted(set(range(count)) - set(leaders))
        if missing:
            raise _LeaderUnknown(f"no leader known for partitions {missing} of {topic}")
        return leaders

    # Offsets ------------------------------------------------------------------------------

    async def end_offsets(self, topic: str, count: int) -> list[int]:
        """Last stable offsets of partitions 0..count-1: the high watermark, or the first
        offset of a transaction still open there.

        Raises KafkaUnavailable (also when a partition does not exist), KafkaFailure.
        """
        return [end.offset for end in await self.stable_offsets(topic, count)]

    async def stable_offsets(self, topic: str, count: int) -> list[OffsetAndEpoch]:
        """Last stable offsets of partitions 0..count-1, each with the epoch of the
        leader that answered it (ListOffsets v4+, read_committed, from each leader in
        the epoch the metadata named): a change's boundaries.

        Offset and epoch come from one answer of one leader: an epoch read apart from
        its offset could belong to a leader elected after the offset was read, whose
        log may already have been truncated below it. Raises like end_offsets.
        """
        what = f"end offsets of {topic}"

        async def ask() -> list[OffsetAndEpoch]:
            leaders = await self._leaders(topic, count)
            answers: dict[int, OffsetAndEpoch] = {}
            for node, partitions in _by_node(leaders).items():
                request = EpochListOffsetsRequest(topic, partitions)
                response = await _send(self._require().producer.client, node, request)
                for _, partition, error_code, _, offset, epoch in _partition_rows(response):
                    _raise_for_partition(error_code, what)
                    answers[partition] = OffsetAndEpoch(int(offset), _epoch(epoch))
            return [answers[partition] for partition in range(count)]

        return await self._retrying(ask, what)  # type: ignore[no-any-return]

    async def epoch_end_offsets(
        self, topic: str, epochs: Mapping[int, int]
    ) -> dict[int, OffsetAndEpoch | None]:
        """Where each asked leader epoch ends in its partition's log, on the current
        leader (OffsetForLeaderEpoch v3): the largest epoch at or below the asked one
        that the leader knows, and the offset where the next epoch began (the log end
        for the current epoch). None for a partition whose leader knows no epoch that
        new. A record below that offset of that epoch is still in the log; a boundary
        above it was truncated away (KIP-320).

        Raises KafkaUnavailable (also when a partition does not exist), KafkaFailure.
        """
        what = f"end offsets of leader epochs of {topic}"
        count = max(epochs, default=-1) + 1

        async def ask() -> dict[int, OffsetAndEpoch | None]:
            leaders = await self._leaders(topic, count)
            current = {p: leaders[p] for p in epochs}
            answers: dict[int, OffsetAndEpoch | None] = {}
            for node, partitions in _by_node(current).items():
                asked = {p: (partitions[p], epochs[p]) for p in partitions}
                request = OffsetForLeaderEpochRequest(topic, asked)
                response = await _send(self._require().producer.client, node, request)
                for _, error_code, partition, epoch, end_offset in _partition_rows(response):
                    _raise_for_partition(error_code, what)
                    answers[partition] = (
                        None if epoch == NO_EPOCH else OffsetAndEpoch(int(end_offset), epoch)
                    )
            return answers

        return await self._retrying(ask, what)  # type: ignore[no-any-return]

    async def log_start_offsets(self, topic: str, count: int) -> list[int]:
        """Low watermarks of partitions 0..count-1. Raises like end_offsets."""
        partitions = _partitions(topic, count)
        offsets = await self._retrying(
            lambda: self._require().consumer.beginning_offsets(partitions),
            f"log start offsets of {topic}",
        )
        return [int(offsets[tp]) for tp in partitions]

    async def leader_epochs(self, topic: str, count: int) -> list[int | None]:
        """The leader epoch of partitions 0..count-1 as the metadata (v7) names it.

        Raises KafkaUnavailable (also when a partition has no leader), KafkaFailure.
        """
        leaders = await self._retrying(
            lambda: self._leaders(topic, count), f"leader epochs of {topic}"
        )
        return [_epoch(leaders[partition][1]) for partition in range(count)]

    async def delete_records(self, topic: str, before: Mapping[int, int]) -> dict[int, int]:
        """Delete records below ``before[p]`` in each partition; returns the new low
        watermarks. Raises UnknownPartition, KafkaUnavailable, KafkaFailure (an offset
        past the high watermark)."""
        request = {
            TopicPartition(topic, partition): RecordsToDelete(before_offset=offset)
            for partition, offset in before.items()
        }
        try:
            low = await self._require().admin.delete_records(request)
        except UnknownTopicOrPartitionError as exc:
            raise UnknownPartition(f"a partition of {topic} does not exist") from exc
        except KafkaError as exc:
            raise _translated(exc, f"deleting records of {topic}") from exc
        return {tp.partition: int(offset) for tp, offset in low.items()}

    async def committed_offsets(self, group: str, topic: str, count: int) -> dict[int, int]:
        """The offsets ``group`` committed in partitions 0..count-1; partitions without
        a commit are absent. Raises KafkaUnavailable, KafkaFailure."""
        partitions = _partitions(topic, count)
        # A loading or moved coordinator's empty answer raises (check_admin_client) and
        # is retried, rather than read as a group that committed nothing.
        offsets = await self._retrying(
            lambda: self._require().admin.list_consumer_group_offsets(group, partitions=partitions),
            f"committed offsets of group {group}",
        )
        return {
            tp.partition: int(meta.offset)
            for tp, meta in offsets.items()
            if tp.topic == topic and meta.offset >= 0
        }

    # Helpers ------------------------------------------------------------------------------

    def _require(self) -> _Clients:
        if self._clients is None:
            if self._stopped:
                raise ShuttingDown("the Kafka connection is closed")
            raise KafkaUnavailable("the Kafka connection is not started")
        return self._clients

    async def _retrying(self, call: Callable[[], Awaitable[Any]], what: str) -> Any:
        """Run a read-only request, retrying retriable errors until the request timeout.

        Raises KafkaAuthenticationFailed when no connection could be made because Kafka
        refuses this sidecar's credentials (revoked while it runs), KafkaUnavailable
        for other retriable errors, and the translation of the others."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                return await call()
            except KafkaError as exc:
                if not (exc.retriable or isinstance(exc, KafkaTimeoutError)):
                    raise _translated(exc, what) from exc
                if time.monotonic() + self._settings.retry_backoff_s > deadline:
                    refused = await refused_identity(self._settings)
                    if refused is not None:
                        raise KafkaAuthenticationFailed(f"{what}: {refused.message}") from exc
                    raise KafkaUnavailable(f"{what}: {exc}") from exc
            await asyncio.sleep(self._settings.retry_backoff_s)


def client_settings(settings: KafkaSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """(settings for every aiokafka client, extra settings for producers only).

    Every client the sidecar makes is built from these, so each connects with the same
    ``kafka.security``. Raises ConfigError (a TLS file that cannot be used, a
    ``kafka.client`` value of the wrong type)."""
    common: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "request_timeout_ms": settings.request_timeout_ms,
        **security_arguments(settings.security),
    }
    producer: dict[str, Any] = {}
    for name, value in coerced_client_options(settings.client).items():
        if name in _CONNECTION_KEYS:
            common[name] = value
        elif name in ("acks", "enable_idempotence", "transactional_id"):
            # Ordering and fencing depend on these: they are not settings.
            _log.warning("ignoring kafka.client.%s: the sidecar needs its own value", name)
        else:
            producer[name] = value
    return common, producer


def consumer_settings(settings: KafkaSettings, client_suffix: str, **own: Any) -> dict[str, Any]:
    """A group consumer's arguments: ``client_settings``' common part (security
    included) with its own client id, then ``own`` (which wins)."""
    common, _ = client_settings(settings)
    return common | {"client_id": f"{settings.client_id}-{client_suffix}"} | own


async def enqueue(
    producer: Any, topic: str, record: OutgoingKafkaRecord
) -> asyncio.Future[Any] | SendFailed:
    """Queue ``record`` on an aiokafka producer: its delivery future, or SendFailed when
    it is refused before it is queued (it can never be appended then). Raises the fenced
    errors (FENCED_ERRORS): after them the producer writes nothing more."""
    if record.key is None and record.value is None:
        return SendFailed("a tombstone needs a key", maybe_appended=False)
    try:
        return await producer.send(  # type: ignore[no-any-return]
            topic,
            value=record.value,
            key=record.key,
            partition=record.partition,
            headers=list(record.headers),
            timestamp_ms=record.timestamp_ms,
        )
    except FENCED_ERRORS:
        raise
    except KafkaError as exc:
        # send() raises before the record is queued (too large for max_request_size,
        # buffer full, producer closed, the topic's metadata refused by an ACL).
        return SendFailed(
            str(exc), maybe_appended=False, not_authorized=isinstance(exc, _NOT_AUTHORIZED)
        )


def sent_record(metadata: Any) -> SentRecord:
    """An aiokafka ``RecordMetadata`` as a SentRecord."""
    timestamp = metadata.timestamp
    return SentRecord(
        int(metadata.partition),
        int(metadata.offset),
        None if timestamp is None or timestamp < 0 else int(timestamp),
    )


async def start_transactional_producer(settings: KafkaSettings, transactional_id: str) -> Any:
    """A started producer for ``transactional_id``; starting it fences every earlier
    producer of the id. Raises ProducerFenced (someone initialised it meanwhile, or it
    is not authorised), KafkaUnavailable."""
    set_transaction_poll(settings.transaction_poll_ms)
    common, producer_extra = client_settings(settings)
    producer = AIOKafkaProducer(
        **common,
        **producer_extra,
        transactional_id=transactional_id,
        transaction_timeout_ms=settings.transaction_timeout_ms,
    )
    timeout_s = settings.request_timeout_ms / 1000
    try:
        async with asyncio.timeout(timeout_s):
            await producer.start()
    except FENCED_ERRORS as exc:
        await _close_all(producer)
        raise ProducerFenced(f"transactional id {transactional_id}: {exc}") from exc
    except (KafkaError, OSError, TimeoutError) as exc:
        await _close_all(producer)
        refused = await diagnose(settings)
        if refused is not None:
            raise refused from exc
        reason = str(exc) or f"no answer within {timeout_s:g} s"
        message = f"initialising transactional id {transactional_id}: {reason}"
        raise KafkaUnavailable(message) from exc
    return producer


async def refused_identity(settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
    """Whether Kafka now refuses this sidecar's credentials or certificate: one new
    connection to a bootstrap broker (``kafka_security.diagnose``), given half the
    request timeout (None when it could not tell by then).

    aiokafka's clients swallow a refused connection (they log it, and wait for the node
    as for one that is away), so a credential revoked while the sidecar runs shows as
    requests that time out; a failure that Kafka did not answer asks this before it is
    reported as Kafka being unavailable. A PLAINTEXT connection presents nothing to refuse:
    it is not asked (a broker outage would only wait for the connection)."""
    if settings.security.protocol == "PLAINTEXT":
        return None
    try:
        return await asyncio.wait_for(diagnose(settings), settings.request_timeout_ms / 2000)
    except TimeoutError:
        return None
    except ConfigError as exc:  # a password file that went away meanwhile
        return KafkaAuthenticationFailed(str(exc))


def set_transaction_poll(poll_ms: float) -> None:
    """Ask again every ``poll_ms`` to add a partition to a new transaction while the
    coordinator still writes the previous one's markers (CONCURRENT_TRANSACTIONS).

    aiokafka waits a fixed 20 ms there (``BACKOFF_OVERRIDE``, a module constant with no
    setting; Java's client does the same, KAFKA-5477), and the markers take a few ms on a
    healthy cluster: a one-record transaction took 47 ms at 20 ms, 16 ms at 5 ms and 9 ms
    at 2 ms on the local cluster. Process-wide: every transactional producer of the
    process polls at the last value set. ``tests/unit/adapters/test_kafka.py``
    checks that aiokafka still reads the constant there."""
    aiokafka_sender.BACKOFF_OVERRIDE = poll_ms / 1000


# ``timeout`` bounds a polling loop over shared metadata; nothing to cancel.
async def await_partition_count(
    client: Any,
    topic: str,
    count: int,
    timeout: float,  # noqa: ASYNC109
    *,
    backoff_s: float,
) -> None:
    """Wait until an aiokafka client's metadata shows at least ``count`` partitions of
    ``topic`` (a client knows of a new partition only at its next metadata refresh).

    Raises KafkaUnavailable on timeout.
    """
    client.add_topic(topic)
    deadline = time.monotonic() + timeout

    def shown() -> bool:
        return len(client.cluster.partitions_for_topic(topic) or ()) >= count

    while not shown():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KafkaUnavailable(f"the metadata does not show {count} partitions of {topic}")
        await _refresh(client, remaining)
        if not shown():
            # Kafka's metadata lags the controller for a moment after a change.
            await asyncio.sleep(min(backoff_s, max(0.0, deadline - time.monotonic())))


class _LeaderUnknown(KafkaError):  # type: ignore[misc]
    """A partition has no leader now, or the one asked is no longer it (retriable)."""

    retriable = True


# Per-partition answers that a fresh look at the metadata may cure: the leader moved
# (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH), the metadata is ahead of the broker
# (UNKNOWN_LEADER_EPOCH), a new leader does not know its high watermark yet
# (LEADER_NOT_AVAILABLE, OFFSET_NOT_AVAILABLE), a replica is being moved.
_LEADER_CHANGING = frozenset({5, 6, 9, 56, 74, 75, 78})


def _raise_for_partition(error_code: int, what: str) -> None:
    if not error_code:
        return
    if error_code in _LEADER_CHANGING:
        raise _LeaderUnknown(f"{what}: error {error_code} from the partition's leader")
    error = _error_for_code(error_code, what)
    raise error


def _partition_rows(response: Any) -> list[tuple[Any, ...]]:
    """(topic, *partition fields) of every partition of an answer about one topic."""
    return [(topic, *row) for topic, rows in response.topics for row in rows]


def _by_node(leaders: Mapping[int, tuple[int, int]]) -> dict[int, dict[int, int]]:
    """Node -> {partition: leader epoch} of the partitions that node leads."""
    grouped: dict[int, dict[int, int]] = {}
    for partition, (node, epoch) in sorted(leaders.items()):
        grouped.setdefault(node, {})[partition] = epoch
    return grouped


def _epoch(value: int) -> int | None:
    return None if value == NO_EPOCH else int(value)


async def _send(client: Any, node: int, request: Any) -> Any:
    """``client.send``, refusing a broker that cannot carry leader epochs."""
    try:
        return await client.send(node, request)
    except NotImplementedError as exc:
        # aiokafka's Request.prepare: no version both sides know.
        raise KafkaFailure(
            f"broker {node} does not speak {type(request).__name__} with leader epochs "
            "(KIP-320): Kafka 2.1 or later is needed"
        ) from exc


def _partitions(topic: str, count: int) -> list[Any]:
    return [TopicPartition(topic, partition) for partition in range(count)]


async def _refresh(client: Any, within: float) -> None:
    # force_metadata_update returns a shielded future: giving up does not cancel the
    # update, which other waiters may share.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.force_metadata_update(), within)


def _discard_outcome(delivery: asyncio.Future[Any]) -> None:
    # Nobody awaits a delivery we gave up on; retrieve its exception so asyncio does
    # not log "exception was never retrieved".
    if not delivery.cancelled():
        delivery.exception()


def _error_for_code(code: int, message: str) -> KafkaError:
    return for_code(code)(message)


# ACLs refuse this sidecar's principal: an operator's matter, answered 503, never 500.
_NOT_AUTHORIZED = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
)

# Errors Kafka answers when the request itself is wrong: the caller's mistake, not a
# failure of the cluster.
_REFUSED_AS_INVALID = (
    InvalidConfigurationError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    PolicyViolationError,
)


def _principal_refused(settings: KafkaSettings, exc: KafkaError) -> KafkaNotAuthorized:
    security = settings.security
    if security.sasl and security.sasl_mechanism != "OAUTHBEARER":
        principal = f"User:{security.sasl_username} (kafka.security.sasl_username)"
    elif security.ssl_certfile:
        principal = "the subject of kafka.security.ssl_certfile"
    else:
        principal = "this sidecar's principal"
    return KafkaNotAuthorized(
        f"kafka.security: {principal} is not authorized by Kafka's ACLs "
        f"({type(exc).__name__}); it needs the ACLs listed in the README"
    )


def _translated(exc: KafkaError, what: str) -> SidecarError:
    if isinstance(exc, _NOT_AUTHORIZED):
        return KafkaNotAuthorized(f"{what}: {type(exc).__name__}: not allowed by Kafka's ACLs")
    if isinstance(exc, SaslAuthenticationFailed):
        return KafkaAuthenticationFailed(f"{what}: Kafka refused this sidecar's credentials")
    if isinstance(exc, UnknownTopicOrPartitionError):
        return UnknownTopic(f"{what}: {exc}")
    if isinstance(exc, _REFUSED_AS_INVALID):
        return KafkaBadRequest(f"{what}: {exc}")
    if exc.retriable or isinstance(exc, KafkaTimeoutError):
        return KafkaUnavailable(f"{what}: {exc}")
    return KafkaFailure(f"{what}: {exc}")


async def _close_all(*clients: Any) -> None:
    for client in clients:
        close = getattr(client, "stop", None) or client.close
        try:
            await close()
        except (KafkaError, OSError) as exc:
            _log.warning("closing %s failed: %s", type(client).__name__, exc)
