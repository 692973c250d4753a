"""``sidecar.adapters.kafka.clients``: the arguments every Kafka client of the sidecar is
built from (``kafka.client`` split between all clients and producers, the settings
ordering depends on kept), a group consumer's arguments, the clients' life, and their
closing. Clients connected with these arguments to a real cluster are tested in
``tests/integration/test_kafka_gateway.py`` and ``tests/integration/test_secured_delivery.py``."""

from __future__ import annotations

import logging

import pytest
from aiokafka.errors import KafkaConnectionError

from sidecar.adapters.kafka import client_settings, consumer_settings
from sidecar.adapters.kafka.clients import (
    PRODUCER_BATCH_BYTES,
    ConnectionState,
    _Clients,
    _close_all,
)
from sidecar.config import ConfigError, KafkaSecuritySettings, KafkaSettings, Secret
from sidecar.core.errors import KafkaUnavailable, ShuttingDown

LOGGER = "sidecar.adapters.kafka"


def test_every_client_connects_to_the_same_cluster_with_the_same_security() -> None:
    settings = KafkaSettings(
        bootstrap_servers="b1:9092,b2:9092",
        client_id="orders-sidecar",
        request_timeout_ms=7000,
        security=KafkaSecuritySettings(
            protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="orders",
            sasl_password=Secret("s3cret"),
        ),
    )
    common, producer = client_settings(settings)
    assert common == {
        "bootstrap_servers": "b1:9092,b2:9092",
        "client_id": "orders-sidecar",
        "request_timeout_ms": 7000,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "orders",
        "sasl_plain_password": "s3cret",
    }
    assert producer == {"max_batch_size": PRODUCER_BATCH_BYTES}


def test_pass_through_settings_go_to_every_client_or_to_producers_only() -> None:
    settings = KafkaSettings(
        client={
            "linger_ms": "5",  # from the environment: a string, coerced
            "compression_type": "lz4",
            "metadata_max_age_ms": 1000,
            "retry_backoff_ms": "50",
        }
    )
    common, producer = client_settings(settings)
    # Connection settings every aiokafka client accepts: all of them get these.
    assert common["metadata_max_age_ms"] == 1000
    assert common["retry_backoff_ms"] == 50
    # The rest tune producers only (a consumer or admin client would refuse them).
    assert producer == {
        "linger_ms": 5,
        "compression_type": "lz4",
        "max_batch_size": PRODUCER_BATCH_BYTES,
    }


def test_producers_batch_64_kib_unless_kafka_client_says_otherwise() -> None:
    _, producer = client_settings(KafkaSettings())
    assert producer["max_batch_size"] == 65_536
    _, producer = client_settings(KafkaSettings(client={"max_batch_size": "16384"}))
    assert producer["max_batch_size"] == 16_384


@pytest.mark.parametrize("name", ["acks", "enable_idempotence", "transactional_id"])
def test_settings_ordering_and_fencing_rest_on_are_ignored_with_a_warning(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        common, producer = client_settings(KafkaSettings(client={name: "1"}))
    assert name not in common
    assert name not in producer
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        f"ignoring kafka.client.{name}: the sidecar needs its own value"
    ]


def test_a_pass_through_value_of_the_wrong_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.client\.linger_ms must be a int"):
        client_settings(KafkaSettings(client={"linger_ms": "soon"}))


def test_a_group_consumer_has_a_client_id_of_its_own_and_its_own_settings_win() -> None:
    settings = KafkaSettings(client_id="orders-sidecar", client={"linger_ms": 5})
    arguments = consumer_settings(
        settings, "billing-c1", group_id="billing", request_timeout_ms=1234
    )
    assert arguments["client_id"] == "orders-sidecar-billing-c1"
    assert arguments["group_id"] == "billing"
    assert arguments["request_timeout_ms"] == 1234
    assert arguments["security_protocol"] == "PLAINTEXT"
    assert "linger_ms" not in arguments  # a producer's setting


def test_the_clients_are_unavailable_before_start_and_shutting_down_after_stop() -> None:
    state = ConnectionState()
    with pytest.raises(KafkaUnavailable, match="the Kafka connection is not started"):
        state.require()
    clients = _Clients(producer="p", admin="a", consumer="c")
    state.clients = clients
    assert state.require() is clients
    state.stopped, state.clients = True, None
    with pytest.raises(ShuttingDown, match="the Kafka connection is closed"):
        state.require()


class _Stoppable:
    def __init__(self, calls: list[str], name: str, error: Exception | None = None) -> None:
        self.calls, self.name, self.error = calls, name, error

    async def stop(self) -> None:
        self.calls.append(f"stop {self.name}")
        if self.error is not None:
            raise self.error


class _Closable:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    async def close(self) -> None:
        self.calls.append("close admin")


async def test_every_client_is_closed_even_when_one_fails_to(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []
    failing = _Stoppable(calls, "producer", KafkaConnectionError("broker gone"))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await _close_all(failing, _Closable(calls), _Stoppable(calls, "consumer"))
    # aiokafka's producer and consumer stop; its admin client closes.
    assert calls == ["stop producer", "close admin", "stop consumer"]
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "closing _Stoppable failed: KafkaConnectionError: broker gone"
    ]
