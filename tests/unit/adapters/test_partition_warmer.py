"""The warmer of the partitions a change adds. No cluster: a transactional producer
reduced to what the warmer calls (the transaction calls, recorded)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaTimeoutError

from sidecar.adapters import partition_warmer
from sidecar.adapters.partition_warmer import PartitionWarmer
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaUnavailable
from tests.support.kafka_metadata import MetadataClient


class _WarmProducer:
    """A transactional producer as the warmer uses it, recording what it is asked."""

    def __init__(self, fail_partition: int | None = None, hang: bool = False) -> None:
        self.client = MetadataClient(shown=8, after_refresh=8)
        self.calls: list[object] = []
        self.fail_partition = fail_partition
        self.hang = hang
        self.stopped = False

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes,
        partition: int,
        headers: list[tuple[str, bytes]],
    ) -> asyncio.Future[None]:
        # A compacted topic refuses a record without a key: every warm-up has one.
        assert key is not None
        self.calls.append(("send", topic, partition, headers))
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail_partition == partition:
            delivery.set_exception(KafkaTimeoutError())
        elif not self.hang:
            delivery.set_result(None)
        return delivery

    async def abort_transaction(self) -> None:
        self.calls.append("abort")

    async def stop(self) -> None:
        self.stopped = True


def _warmer(
    monkeypatch: pytest.MonkeyPatch, producers: list[_WarmProducer | None], within_s: float = 5.0
) -> _RecordingWarmer:
    started: list[str] = []

    async def start(settings: KafkaSettings, transactional_id: str) -> _WarmProducer:
        started.append(transactional_id)
        producer = producers[len(started) - 1]
        if producer is None:
            raise KafkaUnavailable("initialising transactional id: no answer")
        return producer

    monkeypatch.setattr(partition_warmer, "start_transactional_producer", start)
    warmer = _RecordingWarmer(KafkaSettings(retry_backoff_s=0.01), "sidecar.a~warm", within_s)
    warmer.started = started
    return warmer


class _RecordingWarmer(PartitionWarmer):
    started: list[str]
    """The transactional ids initialised, in order."""


async def test_warming_writes_once_to_each_partition_and_aborts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = _WarmProducer()
    warmer = _warmer(monkeypatch, [producer])
    assert await warmer.warm("orders", range(4, 6))
    mark = [("ordered.warm", b"1")]
    assert producer.calls == [
        "begin",
        ("send", "orders", 4, mark),
        ("send", "orders", 5, mark),
        "abort",
    ]
    # The producer is kept for the next change.
    assert await warmer.warm("orders", [6])
    assert not producer.stopped


async def test_a_failed_warm_up_initialises_its_id_anew_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing, fresh = _WarmProducer(fail_partition=5), _WarmProducer()
    warmer = _warmer(monkeypatch, [failing, fresh])
    assert not await warmer.warm("orders", [4, 5])
    # Not aborted by the producer in doubt: dropped, and the id initialised anew right
    # away (the fresh producer's start), which aborts whatever the old epoch left open.
    # Waiting for the next warm-up left it open until the transaction timeout.
    assert "abort" not in failing.calls
    assert failing.stopped
    assert warmer.started == ["sidecar.a~warm", "sidecar.a~warm"]
    assert fresh.calls == []
    # The fresh producer is the next warm-up's.
    assert await warmer.warm("orders", [6])
    assert fresh.calls[-1] == "abort"
    assert len(warmer.started) == 2


async def test_a_warm_up_that_outlasts_its_bound_gives_up_and_ends_its_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stuck, fresh = _WarmProducer(hang=True), _WarmProducer()
    warmer = _warmer(monkeypatch, [stuck, fresh], within_s=0.2)
    assert not await asyncio.wait_for(warmer.warm("orders", [4]), 5)
    assert stuck.stopped
    assert len(warmer.started) == 2


async def test_a_warm_up_whose_id_cannot_be_initialised_again_tries_at_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing, fresh = _WarmProducer(fail_partition=4), _WarmProducer()
    warmer = _warmer(monkeypatch, [failing, None, fresh])
    assert not await warmer.warm("orders", [4])
    assert len(warmer.started) == 2
    # The coordinator was away for the second initialisation too: the next warm-up's
    # own initialisation aborts what was left.
    assert await warmer.warm("orders", [6])
    assert len(warmer.started) == 3
    assert fresh.calls[-1] == "abort"


async def test_warming_nothing_or_switched_off_starts_no_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not await _warmer(monkeypatch, []).warm("orders", [])
    assert not await _warmer(monkeypatch, [], within_s=0).warm("orders", [4])
