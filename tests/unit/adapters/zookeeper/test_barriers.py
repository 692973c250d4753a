"""``sidecar.adapters.zookeeper.barriers``: what a sidecar's ack writes and how the acks
are read back, and a publish that finds a barrier already pending, with a fake kazoo
client. Publishing, withdrawing and committing against a real ZooKeeper (the multi-op
commit, a coordinator taken over) are tested in
``tests/integration/test_zookeeper_store.py``."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from kazoo.exceptions import NodeExistsError, NoNodeError

from sidecar.adapters.zookeeper.barriers import Barriers
from sidecar.adapters.zookeeper.operations import Operations
from sidecar.core.errors import InvalidName, OperationInProgress, UnknownTopic
from sidecar.core.topics import PendingBarrier
from tests.unit.adapters.zookeeper.support import Answer, connection

BARRIER = "/ordered/topics/orders/barrier/4"


class _Client:
    """Nodes by path; every write recorded."""

    def __init__(self, nodes: dict[str, bytes] | None = None) -> None:
        self.nodes = dict(nodes or {})
        self.writes: list[tuple[str, str, bytes]] = []

    def create(self, path: str, data: bytes = b"") -> None:
        if path in self.nodes:
            raise NodeExistsError()
        if path.rsplit("/", 1)[0] not in self.nodes:
            raise NoNodeError()
        self.nodes[path] = data
        self.writes.append(("create", path, data))

    def set(self, path: str, data: bytes) -> None:
        self.nodes[path] = data
        self.writes.append(("set", path, data))

    def get(self, path: str) -> tuple[bytes, SimpleNamespace]:
        if path not in self.nodes:
            raise NoNodeError()
        return self.nodes[path], SimpleNamespace(version=0)

    def get_async(self, path: str) -> Answer:
        return Answer(lambda: self.get(path))

    def exists(self, path: str) -> SimpleNamespace | None:
        return SimpleNamespace(version=0) if path in self.nodes else None

    def get_children(self, path: str) -> list[str]:
        if path not in self.nodes:
            raise NoNodeError()
        prefix = path + "/"
        return [p[len(prefix) :] for p in self.nodes if p.startswith(prefix)]


def _barriers(client: _Client) -> Barriers:
    made = connection(client)
    return Barriers(made, Operations(made, lock_poll_s=0.01))


async def test_an_ack_names_each_partition_and_the_offset_after_its_last_write() -> None:
    client = _Client({BARRIER: b""})
    barriers = _barriers(client)
    await barriers.ack_barrier("orders", 4, "host-1", {0: 120, 3: 7})
    # Acking again (more partitions settled) overwrites.
    await barriers.ack_barrier("orders", 4, "host-1", {0: 121, 3: 7})
    assert client.writes == [
        ("create", f"{BARRIER}/host-1", b'{"acked":{"0":120,"3":7}}'),
        ("set", f"{BARRIER}/host-1", b'{"acked":{"0":121,"3":7}}'),
    ]
    await barriers.ack_barrier("orders", 4, "host-2", {})
    assert await barriers.barrier_acks("orders", 4) == {
        "host-1": {0: 121, 3: 7},
        "host-2": {},
    }
    assert await barriers.barrier_ackers("orders", 4) == {"host-1", "host-2"}


async def test_an_ack_for_a_finished_barrier_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    client = _Client()  # committed or rolled back: the barrier node is gone
    with caplog.at_level(logging.INFO, logger="sidecar.adapters.zookeeper"):
        await _barriers(client).ack_barrier("orders", 4, "host-1", {0: 1})
    assert client.writes == []
    assert [r.getMessage() for r in caplog.records if r.name == "sidecar.adapters.zookeeper"] == [
        "dropped an ack for the finished barrier 4 of orders"
    ]
    assert await _barriers(client).barrier_acks("orders", 4) == {}
    assert await _barriers(client).barrier_ackers("orders", 4) == frozenset()


async def test_an_ack_from_an_id_that_is_no_sidecar_id_is_refused() -> None:
    client = _Client({BARRIER: b""})
    with pytest.raises(InvalidName):
        await _barriers(client).ack_barrier("orders", 4, "../4", {0: 1})
    assert client.writes == []


async def test_publishing_the_pending_barrier_again_changes_nothing() -> None:
    pending = {"generation": 4, "target_count": 6}
    client = _Client({"/ordered/topics/orders/pending": json.dumps(pending).encode()})
    barriers = _barriers(client)
    await barriers.publish_barrier("orders", PendingBarrier(generation=4, target_count=6))
    assert client.writes == []
    with pytest.raises(OperationInProgress, match="another barrier is pending on 'orders'"):
        await barriers.publish_barrier("orders", PendingBarrier(generation=4, target_count=8))


async def test_a_barrier_for_an_unmanaged_topic_is_refused() -> None:
    with pytest.raises(UnknownTopic, match="topic 'orders' is not managed"):
        await _barriers(_Client()).publish_barrier("orders", PendingBarrier(4, 6))
