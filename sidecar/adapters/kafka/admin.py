"""The Kafka gateway's admin and metadata side, ``KafkaAdmin``: topics and their
partitions, the metadata of the discovery routes, end and log start offsets, leader
epochs, deleted records and a group's committed offsets.

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
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import NewPartitions, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    InvalidPartitionsError,
    KafkaError,
    KafkaTimeoutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from sidecar.adapters.kafka.clients import ConnectionState, _Clients
from sidecar.adapters.kafka.errors import (
    TopicExists,
    _error_for_code,
    _LeaderUnknown,
    _raise_for_partition,
    _translated,
    refused_identity,
)
from sidecar.adapters.kafka_protocol import (
    NO_EPOCH,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    EpochListOffsetsRequest,
    EpochMetadataRequest,
    OffsetForLeaderEpochRequest,
)
from sidecar.config import KafkaSettings
from sidecar.core.errors import (
    InvalidPartitionCount,
    KafkaAuthenticationFailed,
    KafkaFailure,
    KafkaUnavailable,
    UnknownPartition,
    UnknownTopic,
)

_ALREADY_HAS = re.compile(r"already has (\d+) partition")
_UNKNOWN_TOPIC_ERRNO = UnknownTopicOrPartitionError.errno
FALLBACK_CLUSTER_ID = "kafka-cluster"
"""The cluster id answered when Kafka reports none (brokers before 0.10.1)."""


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


class KafkaAdmin:
    """Topics, metadata, offsets and leader epochs: through the gateway's admin client,
    its consumer (log start offsets), and requests of its own sent through the producer's
    client (``kafka_protocol``). Reads are retried until the request timeout
    (``_retrying``)."""

    def __init__(self, settings: KafkaSettings, connection: ConnectionState) -> None:
        self._settings = settings
        self._timeout_s = settings.request_timeout_ms / 1000
        self._connection = connection
        self._cluster_id: str | None = None

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
        return await self._list_offsets(topic, count, READ_COMMITTED, f"end offsets of {topic}")

    async def high_watermarks(self, topic: str, count: int) -> list[int]:
        """High watermarks of partitions 0..count-1: past every record written, of open
        transactions too. Below it, the last stable offset stops at the first record of
        a transaction still open. Raises like end_offsets."""
        ends = await self._list_offsets(
            topic, count, READ_UNCOMMITTED, f"high watermarks of {topic}"
        )
        return [end.offset for end in ends]

    async def _list_offsets(
        self, topic: str, count: int, isolation_level: int, what: str
    ) -> list[OffsetAndEpoch]:
        async def ask() -> list[OffsetAndEpoch]:
            leaders = await self._leaders(topic, count)
            answers: dict[int, OffsetAndEpoch] = {}
            for node, partitions in _by_node(leaders).items():
                request = EpochListOffsetsRequest(
                    topic, partitions, isolation_level=isolation_level
                )
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
        return self._connection.require()

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
