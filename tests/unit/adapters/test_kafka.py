"""The Kafka adapter's hold on aiokafka internals it depends on, its waits on metadata,
and its leader-epoch requests over a client that answers with a real broker's bytes."""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import NodeNotReadyError
from aiokafka.producer import sender as aiokafka_sender

from sidecar.adapters.kafka import (
    KafkaGateway,
    OffsetAndEpoch,
    _Clients,
    set_transaction_poll,
)
from sidecar.adapters.kafka import errors as kafka_errors
from sidecar.config import KafkaSecuritySettings, KafkaSettings
from sidecar.core.errors import KafkaAuthenticationFailed, KafkaFailure, KafkaUnavailable


@pytest.fixture
def restore_backoff_override() -> Iterator[None]:
    before = aiokafka_sender.BACKOFF_OVERRIDE
    yield
    aiokafka_sender.BACKOFF_OVERRIDE = before


def test_aiokafka_still_polls_a_busy_coordinator_with_the_constant_set() -> None:
    # If aiokafka renames the constant or stops returning it for CONCURRENT_TRANSACTIONS,
    # the setting would silently do nothing: fail here instead.
    handler = inspect.getsource(aiokafka_sender.AddPartitionsToTxnHandler.handle_response)
    assert "ConcurrentTransactions" in handler
    assert "return BACKOFF_OVERRIDE" in handler


@pytest.mark.usefixtures("restore_backoff_override")
def test_the_transaction_poll_setting_reaches_aiokafka() -> None:
    set_transaction_poll(5.0)
    assert aiokafka_sender.BACKOFF_OVERRIDE == 0.005
    set_transaction_poll(2.0)
    assert aiokafka_sender.BACKOFF_OVERRIDE == 0.002


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

_WIRE = json.loads((Path(__file__).parent / "data" / "kafka_wire.json").read_text())
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
