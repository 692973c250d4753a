"""Topics as a REST Proxy v2 client discovers them, plus what the sidecar adds.

Read-only: every answer comes from Kafka's metadata and configs and, for a managed
topic, from the sidecar's view of its state in ZooKeeper (generation, undeleted count,
and each partition's mode). A managed topic's partitions are all listed, read-only and
removed ones included, each with its mode, so that a client sees why it may not write
to one. Kafka can hold partitions beyond the managed topic's own (created by an
expansion that was rolled back, reused by the next one): they are listed without a
mode.

Also here: the check that a produce naming a partition in its URL names one that can
take records, answered for the whole request before anything is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sidecar.adapters.kafka import PartitionInfo
from sidecar.core.errors import PartitionReadOnly, UnknownPartition
from sidecar.core.generations import PartitionMode
from sidecar.core.topics import TopicState
from sidecar.service.registry import TopicRegistry
from sidecar.service.topic_ports import DirectoryKafka


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition: where Kafka keeps it, and its mode when the topic is managed."""

    info: PartitionInfo
    mode: PartitionMode | None
    """None for an unmanaged topic, or a partition beyond the managed topic's own."""


@dataclass(frozen=True, slots=True)
class TopicView:
    name: str
    configs: Mapping[str, str | None]
    partitions: tuple[PartitionView, ...]
    managed: TopicState | None
    """The managed topic's state (generation, count, modes); None when unmanaged."""


class TopicDirectory:
    def __init__(self, sidecar: TopicRegistry, kafka: DirectoryKafka) -> None:
        self._sidecar = sidecar
        self._kafka = kafka

    async def names(self) -> list[str]:
        """Every topic of the cluster (internal ones left out), sorted.

        Raises KafkaUnavailable, KafkaFailure.
        """
        return await self._kafka.list_topics()

    async def brokers(self) -> list[int]:
        """The cluster's broker ids, sorted. Raises KafkaUnavailable, KafkaFailure."""
        return await self._kafka.broker_ids()

    async def cluster_id(self) -> str:
        """The Kafka cluster's id (REST Proxy v3 names the cluster by it).

        Raises KafkaUnavailable, KafkaFailure.
        """
        return await self._kafka.cluster_id()

    async def topic(self, name: str) -> TopicView:
        """``name`` with its configs and partitions.

        Raises UnknownTopic, KafkaUnavailable, KafkaFailure, MetadataUnavailable.
        """
        partitions, configs = await asyncio.gather(
            self.partitions(name), self._kafka.topic_configs(name)
        )
        state, views = partitions
        return TopicView(name, configs, views, state)

    async def partitions(self, name: str) -> tuple[TopicState | None, tuple[PartitionView, ...]]:
        """The managed state of ``name`` (None if unmanaged) and its partitions in order.

        Raises UnknownTopic, KafkaUnavailable, KafkaFailure, MetadataUnavailable.
        """
        infos = await self._kafka.describe_partitions(name)
        runtime = await self._sidecar.runtime(name)
        state = None if runtime is None else runtime.state
        modes = () if state is None else state.modes
        views = tuple(
            PartitionView(info, modes[info.partition] if info.partition < len(modes) else None)
            for info in infos
        )
        return state, views

    async def partition(self, name: str, partition: int) -> tuple[TopicState | None, PartitionView]:
        """One partition of ``name``. Raises UnknownTopic, UnknownPartition, like
        ``partitions`` otherwise."""
        state, views = await self.partitions(name)
        for view in views:
            if view.info.partition == partition:
                return state, view
        raise UnknownPartition(f"partition {partition} of {name} does not exist")

    async def check_writable(self, name: str, partition: int) -> None:
        """Raise unless ``partition`` of ``name`` exists and takes records.

        Raises UnknownTopic, UnknownPartition (beyond the topic, or removed),
        PartitionReadOnly (being retired), KafkaUnavailable, MetadataUnavailable.
        """
        runtime = await self._sidecar.runtime(name)
        if runtime is None:
            count = await self._kafka.partition_count(name)
            if partition >= count:
                raise UnknownPartition(
                    f"partition {partition} of {name} does not exist ({count} partitions)"
                )
            return
        modes = runtime.state.modes
        if partition >= len(modes) or modes[partition] is PartitionMode.REMOVED:
            raise UnknownPartition(
                f"partition {partition} of {name} does not exist "
                f"({runtime.state.current.undeleted_count} partitions take records)"
            )
        if modes[partition] is PartitionMode.READ_ONLY:
            raise PartitionReadOnly(f"partition {partition} of {name} is read-only: being retired")

    async def check_partitions_exist(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Raise unless every (topic, partition) exists in Kafka, one lookup per topic.

        Raises UnknownTopic, UnknownPartition, KafkaUnavailable, KafkaFailure.
        """
        highest: dict[str, int] = {}
        for topic, partition in partitions:
            highest[topic] = max(highest.get(topic, -1), partition)
        for topic, partition in sorted(highest.items()):
            count = await self._kafka.partition_count(topic)
            if partition >= count:
                raise UnknownPartition(
                    f"partition {partition} of {topic} does not exist ({count} partitions)"
                )
