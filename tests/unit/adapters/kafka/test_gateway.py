"""``sidecar.adapters.kafka.gateway``: the front class's life cycle (a cluster that
cannot be reached, credentials refused, a producer that will not stop) and the hand-off
of each call to its component, with a closed port and fakes of the components. The
gateway against a real cluster is tested in ``tests/integration/test_kafka_gateway.py``
(and, secured, ``tests/integration/test_secured_refusals.py``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from sidecar.adapters.kafka import KafkaGateway, OutgoingKafkaRecord, _Clients
from sidecar.adapters.kafka import gateway as gateway_module
from sidecar.adapters.kafka.admin import KafkaAdmin
from sidecar.adapters.kafka.writes import KafkaWrites
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaAuthenticationFailed, KafkaUnavailable, ShuttingDown

LOGGER = "sidecar.adapters.kafka"
# Nothing listens on port 1 of the loopback address: every connection is refused at once.
NOWHERE = KafkaSettings(bootstrap_servers="127.0.0.1:1", request_timeout_ms=2000)


async def test_a_cluster_that_cannot_be_reached_is_unavailable_naming_it() -> None:
    gateway = KafkaGateway(NOWHERE)
    with pytest.raises(KafkaUnavailable, match=r"^cannot reach Kafka at 127\.0\.0\.1:1: "):
        await gateway.start()
    # Nothing half-started is left to use.
    with pytest.raises(KafkaUnavailable, match="the Kafka connection is not started"):
        await gateway.topic_exists("orders")


async def test_a_start_whose_credentials_are_refused_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refused = KafkaAuthenticationFailed("kafka.security.sasl_username: Kafka refused ...")

    async def diagnose(settings: KafkaSettings) -> KafkaAuthenticationFailed:
        assert settings is NOWHERE
        return refused

    monkeypatch.setattr(gateway_module, "diagnose", diagnose)
    with pytest.raises(KafkaAuthenticationFailed) as caught:
        await KafkaGateway(NOWHERE).start()
    assert caught.value is refused


async def test_stopping_a_gateway_never_started_is_fine_and_final() -> None:
    gateway = KafkaGateway(NOWHERE)
    await gateway.stop()
    with pytest.raises(ShuttingDown):
        await gateway.partition_count("orders")


class _Client:
    def __init__(self, calls: list[str], name: str, hangs: bool = False) -> None:
        self.calls, self.name, self.hangs = calls, name, hangs

    async def stop(self) -> None:
        self.calls.append(f"stop {self.name}")
        if self.hangs:
            await asyncio.Event().wait()

    async def close(self) -> None:
        self.calls.append(f"close {self.name}")


async def test_a_producer_that_will_not_stop_is_given_up_and_the_rest_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []
    gateway = KafkaGateway(KafkaSettings(request_timeout_ms=50))
    gateway._connection.clients = _Clients(
        producer=_Client(calls, "producer", hangs=True),
        admin=_Client(calls, "admin"),
        consumer=_Client(calls, "consumer"),
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await gateway.stop()
    assert calls == ["stop producer", "stop admin", "stop consumer"]
    (warning,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert warning.startswith("Kafka producer did not stop cleanly, records may be lost")
    await gateway.stop()  # again: nothing left to close
    assert len(calls) == 3


ANSWER: Any = object()


class _Component:
    """Records every call made of it and answers ANSWER."""

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return ANSWER

        return call


async def test_each_call_is_handed_to_its_component_as_given() -> None:
    admin_calls: list[tuple[Any, ...]] = []
    write_calls: list[tuple[Any, ...]] = []
    gateway = KafkaGateway(NOWHERE)
    gateway._admin = cast(KafkaAdmin, _Component(admin_calls))
    gateway._writes = cast(KafkaWrites, _Component(write_calls))
    record = OutgoingKafkaRecord(0, b"k", b"v", [])
    await gateway.create_topic("t", 6, 3, compacted=True, configs={"a": "b"})
    answers: list[Any] = [
        await gateway.committed_offsets("billing", "t", 6),
        await gateway.epoch_end_offsets("t", {0: 4}),
        await gateway.send("t", 2, b"k", None, [("h", b"1")]),
        await gateway.send_batch("t", [record]),
        await gateway.routing_partition_count("t"),
    ]
    assert all(answer is ANSWER for answer in answers)
    await gateway.fence_producer("ordered-host-1-0")
    assert admin_calls == [
        ("create_topic", ("t", 6, 3), {"compacted": True, "configs": {"a": "b"}}),
        ("committed_offsets", ("billing", "t", 6), {}),
        ("epoch_end_offsets", ("t", {0: 4}), {}),
    ]
    assert write_calls == [
        ("send", ("t", 2, b"k", None, [("h", b"1")]), {}),
        ("send_batch", ("t", [record]), {}),
        ("routing_partition_count", ("t",), {}),
        ("fence_producer", ("ordered-host-1-0",), {}),
    ]
