"""``sidecar.service.topics``: the topic directory over a stand-in Kafka and registry.
Which partitions a topic lists and with which mode, the lookup of one partition, and the
checks a produce or an assignment makes before anything is written or read."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest

from sidecar.adapters.kafka import PartitionInfo
from sidecar.core.errors import PartitionReadOnly, UnknownPartition, UnknownTopic
from sidecar.core.generations import PartitionMode
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.service.registry import TopicRegistry
from sidecar.service.topic_ports import DirectoryKafka
from sidecar.service.topics import PartitionView, TopicDirectory, TopicView
from tests.unit.service.fakes import expanded_log

RW, RO, REMOVED = PartitionMode.READ_WRITE, PartitionMode.READ_ONLY, PartitionMode.REMOVED


def infos(count: int) -> list[PartitionInfo]:
    return [PartitionInfo(p, leader=1, replicas=(1,), in_sync=(1,)) for p in range(count)]


@dataclass
class _Kafka:
    """Kafka's topics (name: partition count) and configs; keeps what it was asked."""

    counts: dict[str, int]
    configs: dict[str, Mapping[str, str | None]] = field(default_factory=dict)
    asked: list[tuple[str, str]] = field(default_factory=list)

    def _count(self, name: str) -> int:
        if name not in self.counts:
            raise UnknownTopic(f"topic {name} does not exist")
        return self.counts[name]

    async def list_topics(self) -> list[str]:
        return sorted(self.counts)

    async def broker_ids(self) -> list[int]:
        return [1, 2, 3]

    async def cluster_id(self) -> str:
        return "cluster-a"

    async def describe_partitions(self, name: str) -> list[PartitionInfo]:
        self.asked.append(("describe_partitions", name))
        return infos(self._count(name))

    async def topic_configs(self, name: str) -> Mapping[str, str | None]:
        self._count(name)
        return self.configs.get(name, {})

    async def partition_count(self, name: str) -> int:
        self.asked.append(("partition_count", name))
        return self._count(name)


@dataclass
class _Registry:
    kafka: _Kafka
    states: dict[str, TopicState] = field(default_factory=dict)

    async def runtime(self, name: str) -> Any:
        state = self.states.get(name)
        return None if state is None else SimpleNamespace(name=name, state=state)


def managed(*modes: PartitionMode) -> TopicState:
    """A managed topic expanded from one partition to two (two take records)."""
    return TopicState(TopicConfig("orders", 1, 3), expanded_log(5), modes)


def directory(
    counts: dict[str, int],
    states: dict[str, TopicState] | None = None,
    configs: dict[str, Mapping[str, str | None]] | None = None,
) -> tuple[TopicDirectory, _Kafka]:
    kafka = _Kafka(counts, configs or {})
    registry = _Registry(kafka, states or {})
    return TopicDirectory(cast(TopicRegistry, registry), cast(DirectoryKafka, kafka)), kafka


async def test_the_cluster_is_described_as_kafka_describes_it() -> None:
    topics, _ = directory({"b": 1, "a": 2})
    assert await topics.names() == ["a", "b"]
    assert await topics.brokers() == [1, 2, 3]
    assert await topics.cluster_id() == "cluster-a"


async def test_an_unmanaged_topic_lists_its_partitions_without_modes() -> None:
    topics, _ = directory({"plain": 2}, configs={"plain": {"retention.ms": None}})
    assert await topics.topic("plain") == TopicView(
        "plain",
        {"retention.ms": None},
        (PartitionView(infos(2)[0], None), PartitionView(infos(2)[1], None)),
        None,
    )


async def test_a_managed_topic_lists_every_partition_with_its_mode() -> None:
    state = managed(RW, RO)
    topics, _ = directory({"orders": 2}, {"orders": state})
    view = await topics.topic("orders")
    assert view.managed is state
    assert [(v.info.partition, v.mode) for v in view.partitions] == [(0, RW), (1, RO)]


async def test_kafkas_partitions_beyond_the_managed_topics_own_have_no_mode() -> None:
    topics, _ = directory({"orders": 4}, {"orders": managed(RW, RO)})
    state, views = await topics.partitions("orders")
    assert state == managed(RW, RO)
    assert [v.mode for v in views] == [RW, RO, None, None]


async def test_one_partition_is_found_with_its_topics_state() -> None:
    topics, _ = directory({"orders": 3}, {"orders": managed(RW, RO)})
    state, view = await topics.partition("orders", 1)
    assert state == managed(RW, RO)
    assert view == PartitionView(infos(3)[1], RO)


async def test_a_partition_beyond_the_topic_is_unknown() -> None:
    topics, _ = directory({"plain": 2})
    with pytest.raises(UnknownPartition, match="partition 2 of plain does not exist"):
        await topics.partition("plain", 2)


async def test_an_unknown_topic_is_unknown_for_every_lookup() -> None:
    topics, _ = directory({})
    with pytest.raises(UnknownTopic):
        await topics.topic("nosuch")
    with pytest.raises(UnknownTopic):
        await topics.partition("nosuch", 0)
    with pytest.raises(UnknownTopic):
        await topics.check_writable("nosuch", 0)
    with pytest.raises(UnknownTopic):
        await topics.check_partitions_exist([("nosuch", 0)])


# check_writable ----------------------------------------------------------------------------


async def test_any_partition_kafka_has_takes_records_of_an_unmanaged_topic() -> None:
    topics, _ = directory({"plain": 3})
    await topics.check_writable("plain", 0)
    await topics.check_writable("plain", 2)
    with pytest.raises(UnknownPartition, match=re.escape("does not exist (3 partitions)")):
        await topics.check_writable("plain", 3)


async def test_a_read_write_partition_of_a_managed_topic_takes_records() -> None:
    topics, kafka = directory({"orders": 2}, {"orders": managed(RW, RO)})
    await topics.check_writable("orders", 0)
    # The managed topic's own modes answer: Kafka's partition count is not asked.
    assert ("partition_count", "orders") not in kafka.asked


async def test_a_partition_being_retired_is_read_only() -> None:
    topics, _ = directory({"orders": 2}, {"orders": managed(RW, RO)})
    with pytest.raises(PartitionReadOnly, match="partition 1 of orders is read-only"):
        await topics.check_writable("orders", 1)


async def test_a_removed_partition_no_longer_exists_for_a_produce() -> None:
    topics, _ = directory({"orders": 3}, {"orders": managed(RW, RW, REMOVED)})
    with pytest.raises(UnknownPartition, match="partition 2 of orders does not exist"):
        await topics.check_writable("orders", 2)


async def test_a_partition_kafka_holds_beyond_the_managed_topic_takes_no_records() -> None:
    topics, _ = directory({"orders": 3}, {"orders": managed(RW, RW)})
    with pytest.raises(
        UnknownPartition,
        match=re.escape("partition 2 of orders does not exist (2 partitions take records)"),
    ):
        await topics.check_writable("orders", 2)


# check_partitions_exist --------------------------------------------------------------------


async def test_partitions_kafka_has_exist_and_each_topic_is_looked_up_once() -> None:
    topics, kafka = directory({"a": 3, "b": 1})
    await topics.check_partitions_exist([("b", 0), ("a", 2), ("a", 0), ("a", 1)])
    assert kafka.asked == [("partition_count", "a"), ("partition_count", "b")]


async def test_the_highest_partition_asked_for_a_topic_is_the_one_checked() -> None:
    topics, _ = directory({"a": 3})
    with pytest.raises(
        UnknownPartition, match=re.escape("partition 5 of a does not exist (3 partitions)")
    ):
        await topics.check_partitions_exist([("a", 0), ("a", 5), ("a", 1)])


async def test_no_partitions_need_no_lookup() -> None:
    topics, kafka = directory({})
    await topics.check_partitions_exist([])
    assert kafka.asked == []
