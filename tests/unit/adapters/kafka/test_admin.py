"""``sidecar.adapters.kafka.admin``: the waits on metadata, the leader-epoch requests
over a client that answers with a real broker's bytes (``../data/kafka_wire.json``,
shared with ``test_kafka_protocol.py``), credentials refused at run time, and the
answers read from fake admin and consumer clients. Against a real cluster the admin
side is tested in ``tests/integration/test_kafka_gateway.py`` and
``tests/integration/test_topics.py``."""

from __future__ import annotations

import json
import time
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import InvalidPartitionsError, NodeNotReadyError
from aiokafka.structs import OffsetAndMetadata

from sidecar.adapters.kafka import (
    KafkaGateway,
    OffsetAndEpoch,
    _Clients,
)
from sidecar.adapters.kafka import errors as kafka_errors
from sidecar.adapters.kafka.admin import (
    FALLBACK_CLUSTER_ID,
    KafkaAdmin,
    PartitionInfo,
    _by_node,
    _epoch,
)
from sidecar.adapters.kafka.clients import ConnectionState
from sidecar.adapters.kafka_protocol import NO_EPOCH
from sidecar.config import KafkaSecuritySettings, KafkaSettings
from sidecar.core.errors import (
    InvalidPartitionCount,
    KafkaAuthenticationFailed,
    KafkaFailure,
    KafkaUnavailable,
    UnknownTopic,
)


def _gateway_whose_metadata_answers(answers: list[int | None]) -> tuple[KafkaGateway, list[float]]:
    gateway = KafkaGateway(KafkaSettings(request_timeout_ms=300, retry_backoff_s=0.01))
    asked: list[float] = []

    async def partition_count_or_none(topic: str) -> int | None:
        asked.append(time.monotonic())
        return answers.pop(0) if len(answers) > 1 else answers[0]

    gateway._admin._partition_count_or_none = partition_count_or_none  # type: ignore[method-assign]
    return gateway, asked


async def test_a_topic_reported_existing_is_asked_for_until_metadata_lists_it() -> None:
    # Three sidecars of the demo start together; the one whose create loses the race
    # asked a broker that had not heard of the topic yet, and stopped.
    gateway, asked = _gateway_whose_metadata_answers([None, None, 6])
    assert await gateway.existing_partition_count("audit") == 6
    assert len(asked) == 3


async def test_a_topic_metadata_never_lists_is_unavailable_after_the_request_timeout() -> None:
    gateway, asked = _gateway_whose_metadata_answers([None])
    with pytest.raises(KafkaUnavailable, match="audit exists but metadata does not show it"):
        await gateway.existing_partition_count("audit")
    # Asked again and again until the 300 ms request timeout had passed, not once.
    assert len(asked) > 2
    assert asked[-1] - asked[0] >= 0.3


# Leader epochs: the gateway over a client that answers with a real broker's bytes ------

_WIRE = json.loads((Path(__file__).parents[1] / "data" / "kafka_wire.json").read_text())
_KAFKA_4_3_VERSIONS = {3: (0, 13), 2: (1, 11), 23: (2, 4)}


class _RecordedBroker:
    """An aiokafka client whose broker answers each request with the next captured
    answer of its API (``data/kafka_wire.json``), after aiokafka's own version choice."""

    def __init__(self, answers: dict[int, list[str]], versions: dict[int, tuple[int, int]]):
        self.answers = answers
        self.versions = versions
        self.sent: list[Any] = []

    def get_random_node(self) -> int:
        return 1

    async def send(self, node: int, request: Any) -> Any:
        struct = request.prepare(self.versions)
        self.sent.append(struct)
        name = self.answers[struct.API_KEY].pop(0)
        buffer = BytesIO(bytes.fromhex(_WIRE["exchanges"][name]["response"]))
        struct.parse_response_header(buffer)
        return struct.RESPONSE_TYPE.decode(buffer)


def _gateway_over(broker: _RecordedBroker) -> KafkaGateway:
    gateway = KafkaGateway(KafkaSettings(request_timeout_ms=2000, retry_backoff_s=0.01))
    gateway._connection.clients = _Clients(
        producer=SimpleNamespace(client=broker), admin=None, consumer=None
    )
    return gateway


async def test_stable_offsets_carry_the_epoch_of_the_leader_that_answered() -> None:
    broker = _RecordedBroker({3: ["metadata_v7"], 2: ["list_offsets_v5"]}, _KAFKA_4_3_VERSIONS)
    ends = await _gateway_over(broker).stable_offsets(_WIRE["topic"], 1)
    assert ends == [OffsetAndEpoch(8, _WIRE["epoch"])]
    # Asked of the leader in the epoch the metadata named, for the last stable offset.
    asked = broker.sent[-1].to_object()
    assert asked["isolation_level"] == 1
    assert asked["topics"][0]["partitions"] == [
        {"partition": 0, "current_leader_epoch": _WIRE["epoch"], "timestamp": -1}
    ]


async def test_a_fenced_leader_epoch_is_asked_again_after_fresh_metadata() -> None:
    broker = _RecordedBroker(
        {3: ["metadata_v7", "metadata_v7"], 2: ["list_offsets_v5_stale_epoch", "list_offsets_v5"]},
        _KAFKA_4_3_VERSIONS,
    )
    ends = await _gateway_over(broker).stable_offsets(_WIRE["topic"], 1)
    assert ends == [OffsetAndEpoch(8, _WIRE["epoch"])]
    assert [type(s).__name__ for s in broker.sent] == [
        "MetadataRequest_v7",
        "ListOffsetsRequest_v5",
        "MetadataRequest_v7",
        "ListOffsetsRequest_v5",
    ]


async def test_leader_epochs_come_from_the_metadata() -> None:
    broker = _RecordedBroker({3: ["metadata_v7"]}, _KAFKA_4_3_VERSIONS)
    epochs = await _gateway_over(broker).leader_epochs(_WIRE["topic"], 2)
    assert epochs[0] == _WIRE["epoch"]
    assert epochs[1] is not None


async def test_an_epoch_ends_where_the_next_leader_began() -> None:
    broker = _RecordedBroker(
        {3: ["metadata_v7"], 23: ["offset_for_leader_epoch_v3_old"]}, _KAFKA_4_3_VERSIONS
    )
    ended = await _gateway_over(broker).epoch_end_offsets(_WIRE["topic"], {0: _WIRE["old_epoch"]})
    assert ended == {0: OffsetAndEpoch(_WIRE["records_before_leader_change"], _WIRE["old_epoch"])}
    asked = broker.sent[-1].to_object()["topics"][0]["partitions"]
    assert asked == [
        {"partition": 0, "current_leader_epoch": _WIRE["epoch"], "leader_epoch": _WIRE["old_epoch"]}
    ]


async def test_a_broker_without_leader_epochs_is_a_failure_not_an_outage() -> None:
    # Kafka 2.0 announces Metadata up to v6: retrying would never help.
    broker = _RecordedBroker({3: ["metadata_v7"]}, {3: (0, 6), 2: (0, 3), 23: (0, 1)})
    with pytest.raises(KafkaFailure, match=r"Kafka 2\.1 or later"):
        await _gateway_over(broker).leader_epochs(_WIRE["topic"], 1)


# Credentials refused at run time ----------------------------------------------------------


def _gateway_that_cannot_reach_a_node(
    monkeypatch: pytest.MonkeyPatch, diagnosis: KafkaAuthenticationFailed | None
) -> KafkaGateway:
    async def diagnose(settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
        return diagnosis

    monkeypatch.setattr(kafka_errors, "diagnose", diagnose)
    secured = KafkaSecuritySettings(protocol="SASL_SSL")
    return KafkaGateway(
        KafkaSettings(request_timeout_ms=200, retry_backoff_s=0.01, security=secured)
    )


async def _no_connection() -> None:
    # What aiokafka raises when it cannot connect to a node (it logs the reason).
    raise NodeNotReadyError("Attempt to send a request to node which is not ready")


async def test_a_read_that_cannot_connect_because_credentials_are_refused_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refused = KafkaAuthenticationFailed(
        "kafka.security.sasl_username / kafka.security.sasl_password: Kafka refused ..."
    )
    gateway = _gateway_that_cannot_reach_a_node(monkeypatch, refused)
    with pytest.raises(KafkaAuthenticationFailed) as caught:
        await gateway._admin._retrying(_no_connection, "reading metadata of orders")
    assert caught.value.error_code == 50370
    assert caught.value.message.startswith("reading metadata of orders: kafka.security.sasl_")


async def test_a_read_that_cannot_connect_to_a_cluster_away_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = _gateway_that_cannot_reach_a_node(monkeypatch, None)
    with pytest.raises(KafkaUnavailable):
        await gateway._admin._retrying(_no_connection, "reading metadata of orders")


# Answers read from fake clients -----------------------------------------------------------


def test_partitions_are_asked_of_their_leaders_one_request_per_node() -> None:
    leaders = {3: (2, 7), 0: (1, 5), 1: (2, 7), 2: (1, 6)}
    assert _by_node(leaders) == {1: {0: 5, 2: 6}, 2: {1: 7, 3: 7}}


def test_no_epoch_is_none() -> None:
    assert _epoch(NO_EPOCH) is None
    assert _epoch(0) == 0


def _partition(number: int, leader: int, epoch: int, replicas: list[int]) -> dict[str, Any]:
    return {
        "error_code": 0,
        "partition": number,
        "leader": leader,
        "leader_epoch": epoch,
        "replicas": replicas,
        "isr": replicas[:1],
        "offline_replicas": [],
    }


class _MetadataBroker:
    """A producer's aiokafka client whose every broker answers Metadata with ``metadata``
    (as ``to_object`` and as the rows of ``topics``); the requests sent are counted."""

    def __init__(self, metadata: dict[str, Any]) -> None:
        self.metadata = metadata
        self.sent = 0

    def get_random_node(self) -> int:
        return 1

    async def send(self, node: int, request: Any) -> Any:
        self.sent += 1
        rows = [
            (t["error_code"], t["topic"], t["is_internal"], t["partitions"])
            for t in self.metadata["topics"]
        ]
        return SimpleNamespace(topics=rows, to_object=lambda: self.metadata)


def _admin_over(broker: Any = None, admin: Any = None) -> KafkaAdmin:
    connection = ConnectionState()
    connection.clients = _Clients(
        producer=SimpleNamespace(client=broker), admin=admin, consumer=None
    )
    return KafkaAdmin(KafkaSettings(request_timeout_ms=500, retry_backoff_s=0.01), connection)


def _metadata(*topics: dict[str, Any], cluster_id: str | None = "c1") -> dict[str, Any]:
    brokers = [{"node_id": 3}, {"node_id": 1}, {"node_id": 2}]
    return {"topics": list(topics), "brokers": brokers, "cluster_id": cluster_id}


def _topic(name: str, *partitions: dict[str, Any], error: int = 0, internal: bool = False) -> Any:
    return {"error_code": error, "topic": name, "is_internal": internal, "partitions": partitions}


async def test_listed_topics_are_sorted_without_internal_or_failed_ones() -> None:
    broker = _MetadataBroker(
        _metadata(
            _topic("payments"),
            _topic("__consumer_offsets", internal=True),
            _topic("audit"),
            _topic("hidden", error=29),  # TOPIC_AUTHORIZATION_FAILED
        )
    )
    admin = _admin_over(broker)
    assert await admin.list_topics() == ["audit", "payments"]
    assert await admin.broker_ids() == [1, 2, 3]


async def test_partitions_are_described_in_order_with_their_leaders_epoch() -> None:
    broker = _MetadataBroker(
        _metadata(
            _topic(
                "orders",
                _partition(1, -1, NO_EPOCH, [2, 3]),  # no leader now
                _partition(0, 1, 4, [1, 2]),
            )
        )
    )
    assert await _admin_over(broker).describe_partitions("orders") == [
        PartitionInfo(0, 1, (1, 2), (1,), leader_epoch=4),
        PartitionInfo(1, -1, (2, 3), (2,), leader_epoch=None),
    ]


async def test_describing_an_unknown_topic_is_refused() -> None:
    broker = _MetadataBroker(_metadata(_topic("orders", error=3)))  # UNKNOWN_TOPIC_OR_PART
    with pytest.raises(UnknownTopic, match="topic orders does not exist"):
        await _admin_over(broker).describe_partitions("orders")
    assert await _admin_over(broker).topic_exists("orders") is False


async def test_the_cluster_id_is_asked_once_with_a_fallback_for_old_brokers() -> None:
    broker = _MetadataBroker(_metadata(cluster_id=None))
    admin = _admin_over(broker)
    assert await admin.cluster_id() == FALLBACK_CLUSTER_ID
    assert await admin.cluster_id() == FALLBACK_CLUSTER_ID
    assert broker.sent == 1


class _AdminClient:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.asked: list[Any] = []

    async def create_partitions(self, request: Any) -> None:
        self.asked.append(request)
        if self.error is not None:
            raise self.error

    async def list_consumer_group_offsets(self, group: str, partitions: Any) -> Any:
        return {
            TopicPartition("orders", 0): OffsetAndMetadata(120, ""),
            TopicPartition("orders", 1): OffsetAndMetadata(-1, ""),  # no commit
            TopicPartition("other", 0): OffsetAndMetadata(7, ""),
        }

    async def describe_configs(self, resources: Any) -> Any:
        entries = [
            {"config_names": "cleanup.policy", "config_value": "compact", "is_sensitive": False},
            {"config_names": "sasl.jaas.config", "config_value": "x", "is_sensitive": True},
        ]
        resource = {"error_code": 0, "error_message": None, "config_entries": entries}
        return [SimpleNamespace(to_object=lambda: {"resources": [resource]})]


def _orders_with(count: int) -> _MetadataBroker:
    partitions = [_partition(p, 1, 0, [1]) for p in range(count)]
    return _MetadataBroker(_metadata(_topic("orders", *partitions)))


async def test_a_topic_already_that_large_is_left_alone() -> None:
    client = _AdminClient()
    assert await _admin_over(_orders_with(8), client).create_partitions("orders", 6) == 8
    assert client.asked == []


async def test_a_topic_grown_meanwhile_counts_as_grown_by_the_controllers_word() -> None:
    # Read 4, asked for 8: someone else had grown it to 10 in between.
    client = _AdminClient(InvalidPartitionsError("Topic already has 10 partitions."))
    assert await _admin_over(_orders_with(4), client).create_partitions("orders", 8) == 10


async def test_a_partition_count_kafka_refuses_is_an_invalid_count() -> None:
    client = _AdminClient(InvalidPartitionsError("Number of partitions must be larger than 0."))
    with pytest.raises(InvalidPartitionCount):
        await _admin_over(_orders_with(4), client).create_partitions("orders", 8)


async def test_committed_offsets_are_the_topics_partitions_that_have_one() -> None:
    admin = _admin_over(admin=_AdminClient())
    assert await admin.committed_offsets("billing", "orders", 2) == {0: 120}


async def test_a_sensitive_config_is_named_without_its_value() -> None:
    admin = _admin_over(admin=_AdminClient())
    assert await admin.topic_configs("orders") == {
        "cleanup.policy": "compact",
        "sasl.jaas.config": None,
    }
