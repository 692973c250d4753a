"""The warmer of the partitions a change adds. No cluster: a transactional producer
reduced to what the warmer calls (the transaction calls, recorded)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaTimeoutError

from sidecar.adapters import partition_warmer
from sidecar.adapters.partition_warmer import PartitionWarmer
from sidecar.config import KafkaSettings
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
    monkeypatch: pytest.MonkeyPatch, producers: list[_WarmProducer], within_s: float = 5.0
) -> PartitionWarmer:
    started: list[str] = []

    async def start(settings: KafkaSettings, transactional_id: str) -> _WarmProducer:
        started.append(transactional_id)
        return producers[len(started) - 1]

    monkeypatch.setattr(partition_warmer, "start_transactional_producer", start)
    return PartitionWarmer(KafkaSettings(retry_backoff_s=0.01), "sidecar.a~warm", within_s)


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


async def test_a_failed_warm_up_drops_its_producer_and_the_next_starts_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing, fresh = _WarmProducer(fail_partition=5), _WarmProducer()
    warmer = _warmer(monkeypatch, [failing, fresh])
    assert not await warmer.warm("orders", [4, 5])
    # Never committed, and not aborted by a producer in doubt: dropped, so that the
    # next one's initialisation of the id aborts whatever it left open.
    assert "abort" not in failing.calls
    assert failing.stopped
    assert await warmer.warm("orders", [6])
    assert fresh.calls[-1] == "abort"


async def test_a_warm_up_that_outlasts_its_bound_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stuck = _WarmProducer(hang=True)
    warmer = _warmer(monkeypatch, [stuck], within_s=0.2)
    assert not await asyncio.wait_for(warmer.warm("orders", [4]), 5)
    assert stuck.stopped


async def test_warming_nothing_or_switched_off_starts_no_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not await _warmer(monkeypatch, []).warm("orders", [])
    assert not await _warmer(monkeypatch, [], within_s=0).warm("orders", [4])
