"""Making topics managed (``sidecar.service.admin``): create, adopt, describe.

Over fakes of Kafka (its topics, their partitions' leader epochs) and of ZooKeeper's
topic records and change lock. What is checked: which requests are refused before
anything is written, what ends up in Kafka and in ZooKeeper, and the module's promise
that a topic is never half-managed: one created in Kafka whose ZooKeeper record could
not be written stays unmanaged, and is adopted on the retry.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from sidecar.adapters.kafka import KafkaGateway, TopicExists
from sidecar.adapters.zookeeper import LockHolder, MetadataStore
from sidecar.audit.emitter import AuditEmitter
from sidecar.core.errors import (
    BadRequest,
    InvalidName,
    InvalidPartitionCount,
    KafkaBadRequest,
    KafkaUnavailable,
    MetadataUnavailable,
    SidecarError,
    TopicAlreadyManaged,
    UnknownTopic,
)
from sidecar.core.generations import Boundary, Generation, PartitionMode
from sidecar.core.procedures import MAX_PARTITION_COUNT
from sidecar.core.serialization import log_from_generations
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.metrics import SidecarMetrics
from sidecar.service.admin import (
    MAX_REPLICATION_FACTOR,
    CreateTopic,
    LockHolding,
    TopicAdmin,
)

RW = PartitionMode.READ_WRITE


class _Zk:
    """The managed topics' records and change locks, as ``MetadataStore`` keeps them:
    ``create_topic`` refuses a topic managed already, ``read_topic`` an unmanaged one."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicState] = {}
        self.holders: dict[str, LockHolder] = {}
        self.failure: SidecarError | None = None
        """Raised by the next ``create_topic`` (the session lost meanwhile)."""

    async def read_topic(self, topic: str) -> TopicState:
        if topic not in self.topics:
            raise UnknownTopic(f"topic {topic!r} is not managed")
        return self.topics[topic]

    async def create_topic(
        self, config: TopicConfig, generation0: Generation, modes: tuple[PartitionMode, ...]
    ) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
        if config.name in self.topics:
            raise TopicAlreadyManaged(f"topic {config.name!r} is already managed")
        # As the real store reads it back: the log rebuilt, its invariants checked again.
        log = log_from_generations(config.initial_count, [generation0])
        self.topics[config.name] = TopicState(config, log, modes, (None,) * len(modes))

    async def lock_holder(self, topic: str) -> LockHolder | None:
        return self.holders.get(topic)


class _Kafka:
    """Kafka's topics (name -> partition count) and the leader epoch of each partition."""

    def __init__(self, topics: Mapping[str, int] | None = None) -> None:
        self.topics = dict(topics or {})
        self.epochs: dict[str, list[int | None]] = {}
        self.created: list[dict[str, Any]] = []
        self.asked: list[str] = []
        self.refusal: SidecarError | None = None
        """Raised by ``create_topic`` (Kafka refused a config, a policy)."""
        self.epochs_failure: SidecarError | None = None

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        *,
        compacted: bool,
        configs: Mapping[str, str] | None = None,
    ) -> None:
        if self.refusal is not None:
            raise self.refusal
        if topic in self.topics:
            raise TopicExists(topic)
        self.topics[topic] = partitions
        self.created.append(
            {
                "topic": topic,
                "partitions": partitions,
                "replication_factor": replication_factor,
                "compacted": compacted,
                "configs": dict(configs or {}),
            }
        )

    async def partition_count(self, topic: str) -> int:
        self.asked.append(topic)
        if topic not in self.topics:
            raise UnknownTopic(f"topic {topic} does not exist")
        return self.topics[topic]

    async def leader_epochs(self, topic: str, count: int) -> list[int | None]:
        if self.epochs_failure is not None:
            raise self.epochs_failure
        return self.epochs.get(topic, [0] * count)[:count]


class _Audit:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)


class _Admin:
    """A ``TopicAdmin`` over fakes, and the fakes."""

    def __init__(self, kafka_topics: Mapping[str, int] | None = None) -> None:
        self.zk = _Zk()
        self.kafka = _Kafka(kafka_topics)
        self.audit = _Audit()
        self.metrics = SidecarMetrics(CollectorRegistry())
        self.admin = TopicAdmin(
            cast(MetadataStore, self.zk),
            cast(KafkaGateway, self.kafka),
            self.metrics,
            cast(AuditEmitter, self.audit),
        )

    def operations(self, kind: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "sidecar_admin_operations_total", {"kind": kind, "result": "done"}
        )
        return 0.0 if value is None else value


# Create -----------------------------------------------------------------------------------


async def test_a_created_topic_is_made_in_kafka_then_managed_from_generation_0() -> None:
    fakes = _Admin()
    fakes.kafka.epochs["orders"] = [5, 7, None]
    request = CreateTopic(
        "orders", 3, 2, compacted=True, ordered_delivery=False, configs={"segment.ms": "60000"}
    )
    state = await fakes.admin.create(request)

    assert fakes.kafka.created == [
        {
            "topic": "orders",
            "partitions": 3,
            "replication_factor": 2,
            "compacted": True,
            "configs": {"segment.ms": "60000"},
        }
    ]
    assert state.config == TopicConfig("orders", 3, 2, compacted=True, ordered_delivery=False)
    # Generation 0 begins at offset 0 everywhere, each boundary with its partition's
    # leader epoch (KIP-320), so a later truncation below it can be detected.
    assert state.log.generations == (
        Generation(0, 3, (Boundary(0, 5), Boundary(0, 7), Boundary(0, None))),
    )
    assert state.modes == (RW, RW, RW)
    assert state.pending is None
    # What is returned is what ZooKeeper now holds.
    assert fakes.zk.topics["orders"] == state
    assert fakes.operations("create") == 1
    assert fakes.audit.events == [
        {
            "type": "admin",
            "topic": "orders",
            "kind": "create",
            "result": "done",
            "from_count": 0,
            "target_count": 3,
        }
    ]


async def test_the_largest_counts_kafka_can_hold_are_accepted() -> None:
    fakes = _Admin()
    request = CreateTopic("wide", MAX_PARTITION_COUNT, MAX_REPLICATION_FACTOR)
    state = await fakes.admin.create(request)
    assert state.log.current.undeleted_count == MAX_PARTITION_COUNT == 10_000
    assert state.config.replication_factor == MAX_REPLICATION_FACTOR == 32_767


@pytest.mark.parametrize(
    ("request_", "error", "message"),
    [
        (CreateTopic("a/b", 1, 1), InvalidName, "not a topic name"),
        (CreateTopic("..", 1, 1), InvalidName, "not a topic name"),
        (CreateTopic("t", 0, 1), InvalidPartitionCount, "between 1 and 10000, got 0"),
        (CreateTopic("t", 10_001, 1), InvalidPartitionCount, "got 10001"),
        (CreateTopic("t", 1, 0), BadRequest, "between 1 and 32767, got 0"),
        # Kafka's field is an int16: 32768 could not even be sent.
        (CreateTopic("t", 1, 32_768), BadRequest, "got 32768"),
        (
            CreateTopic("t", 1, 1, configs={"cleanup.policy": "compact"}),
            BadRequest,
            "with the compacted field",
        ),
    ],
)
async def test_a_request_kafka_would_refuse_is_refused_before_anything_is_written(
    request_: CreateTopic, error: type[SidecarError], message: str
) -> None:
    fakes = _Admin()
    with pytest.raises(error, match=message) as refused:
        await fakes.admin.create(request_)
    # InvalidName is a BadRequest too; a partition count is not.
    assert isinstance(refused.value, BadRequest) == (error is not InvalidPartitionCount)
    assert fakes.kafka.created == []
    assert fakes.kafka.topics == {}
    assert fakes.zk.topics == {}
    assert fakes.operations("create") == 0
    assert fakes.audit.events == []


async def test_creating_a_managed_topic_is_refused_without_asking_kafka() -> None:
    fakes = _Admin()
    await fakes.admin.create(CreateTopic("orders", 2, 1))
    before = fakes.zk.topics["orders"]
    fakes.kafka.topics.clear()  # Kafka would take it: the refusal must come from ZooKeeper

    with pytest.raises(TopicAlreadyManaged, match="already managed"):
        await fakes.admin.create(CreateTopic("orders", 5, 1))
    assert fakes.kafka.topics == {}
    assert len(fakes.kafka.created) == 1
    assert fakes.zk.topics["orders"] is before
    assert fakes.operations("create") == 1


async def test_creating_a_topic_kafka_has_already_says_to_adopt_it() -> None:
    fakes = _Admin({"legacy": 4})
    with pytest.raises(TopicAlreadyManaged, match="already exists in Kafka; adopt it") as refused:
        await fakes.admin.create(CreateTopic("legacy", 8, 1))
    assert isinstance(refused.value.__cause__, TopicExists)
    assert fakes.kafka.topics == {"legacy": 4}
    assert fakes.zk.topics == {}
    assert fakes.operations("create") == 0


async def test_a_topic_kafka_refuses_to_create_is_not_managed() -> None:
    fakes = _Admin()
    fakes.kafka.refusal = KafkaBadRequest("Unknown topic config name: segment.bogus")
    with pytest.raises(KafkaBadRequest, match=r"segment\.bogus"):
        await fakes.admin.create(CreateTopic("orders", 2, 1, configs={"segment.bogus": "1"}))
    assert fakes.zk.topics == {}
    assert fakes.audit.events == []


async def test_a_topic_whose_record_was_not_written_stays_unmanaged_and_is_adopted_next() -> None:
    fakes = _Admin()
    fakes.kafka.epochs["orders"] = [3, 3]
    fakes.zk.failure = MetadataUnavailable()
    with pytest.raises(MetadataUnavailable):
        await fakes.admin.create(CreateTopic("orders", 2, 1))
    # Kafka has the topic, but only the ZooKeeper record makes it managed: it is not.
    assert fakes.kafka.topics == {"orders": 2}
    assert fakes.zk.topics == {}
    assert fakes.operations("create") == 0
    assert fakes.audit.events == []

    # The client retries: told to adopt, which then manages it as it is.
    with pytest.raises(TopicAlreadyManaged, match="adopt it instead"):
        await fakes.admin.create(CreateTopic("orders", 2, 1))
    state = await fakes.admin.adopt("orders")
    assert state.log.generations == (Generation(0, 2, (Boundary(0, 3), Boundary(0, 3))),)
    assert fakes.operations("adopt") == 1


async def test_leader_epochs_not_read_leave_the_created_topic_unmanaged() -> None:
    fakes = _Admin()
    fakes.kafka.epochs_failure = KafkaUnavailable("no leader for orders-1")
    with pytest.raises(KafkaUnavailable):
        await fakes.admin.create(CreateTopic("orders", 2, 1))
    assert fakes.kafka.topics == {"orders": 2}
    assert fakes.zk.topics == {}


async def test_creating_without_an_audit_emitter_still_counts_the_operation() -> None:
    zk, kafka = _Zk(), _Kafka()
    metrics = SidecarMetrics(CollectorRegistry())
    admin = TopicAdmin(cast(MetadataStore, zk), cast(KafkaGateway, kafka), metrics)
    await admin.create(CreateTopic("orders", 1, 1))
    assert "orders" in zk.topics
    counted = metrics.registry.get_sample_value(
        "sidecar_admin_operations_total", {"kind": "create", "result": "done"}
    )
    assert counted == 1


# Adopt ------------------------------------------------------------------------------------


async def test_an_adopted_topic_is_managed_with_its_partition_count_as_generation_0() -> None:
    fakes = _Admin({"legacy": 6})
    fakes.kafka.epochs["legacy"] = [1, 2, 3, 4, 5, 6]
    state = await fakes.admin.adopt("legacy", compacted=True, ordered_delivery=False)

    # U == N: Kafka's default partitioner already hashes keys over 6 partitions, so the
    # records there belong to generation 0 and no key moves.
    assert state.log.initial_count == 6
    assert state.log.generations == (
        Generation(0, 6, tuple(Boundary(0, epoch) for epoch in range(1, 7))),
    )
    assert state.modes == (RW,) * 6
    # The replication factor is not read from Kafka: 0 is stored.
    assert state.config == TopicConfig("legacy", 6, 0, compacted=True, ordered_delivery=False)
    assert fakes.kafka.created == []
    assert fakes.zk.topics["legacy"] == state
    assert fakes.operations("adopt") == 1
    assert fakes.operations("create") == 0
    assert fakes.audit.events == [
        {
            "type": "admin",
            "topic": "legacy",
            "kind": "adopt",
            "result": "done",
            "from_count": 0,
            "target_count": 6,
        }
    ]


async def test_adopting_a_topic_kafka_does_not_have_is_refused() -> None:
    fakes = _Admin()
    with pytest.raises(UnknownTopic):
        await fakes.admin.adopt("missing")
    assert fakes.zk.topics == {}
    assert fakes.operations("adopt") == 0
    assert fakes.audit.events == []


async def test_adopting_a_managed_topic_is_refused_without_asking_kafka() -> None:
    fakes = _Admin()
    await fakes.admin.create(CreateTopic("orders", 2, 1))
    before = fakes.zk.topics["orders"]
    with pytest.raises(TopicAlreadyManaged, match="orders is already managed"):
        await fakes.admin.adopt("orders")
    assert fakes.kafka.asked == []
    assert fakes.zk.topics["orders"] is before
    assert fakes.operations("adopt") == 0


async def test_adopting_an_invalid_name_is_refused_before_any_lookup() -> None:
    fakes = _Admin()
    with pytest.raises(InvalidName):
        await fakes.admin.adopt("orders/../x")
    assert fakes.kafka.asked == []


# Describe ---------------------------------------------------------------------------------


async def test_a_topic_nobody_changes_is_described_without_a_lock() -> None:
    fakes = _Admin()
    created = await fakes.admin.create(CreateTopic("orders", 2, 1))
    description = await fakes.admin.describe("orders")
    assert description.state == created
    assert description.lock is None


async def test_a_held_lock_is_described_with_its_holder_purpose_and_age() -> None:
    fakes = _Admin()
    await fakes.admin.create(CreateTopic("orders", 2, 1))
    fakes.zk.holders["orders"] = LockHolder("sidecar-b", "resuming a change", time.time() - 2.5)
    lock = (await fakes.admin.describe("orders")).lock
    assert lock is not None
    assert (lock.holder, lock.purpose) == ("sidecar-b", "resuming a change")
    assert 2.5 <= lock.age_s < 3.5
    assert lock.age_s == round(lock.age_s, 3)


async def test_a_lock_taken_by_a_sidecar_whose_clock_runs_ahead_is_not_of_negative_age() -> None:
    fakes = _Admin()
    await fakes.admin.create(CreateTopic("orders", 2, 1))
    fakes.zk.holders["orders"] = LockHolder("sidecar-b", "change", time.time() + 60)
    assert (await fakes.admin.describe("orders")).lock == LockHolding("sidecar-b", "change", 0.0)


async def test_describing_an_unmanaged_topic_is_refused() -> None:
    fakes = _Admin({"legacy": 3})
    with pytest.raises(UnknownTopic):
        await fakes.admin.describe("legacy")
