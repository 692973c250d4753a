"""The ZooKeeper adapter when kazoo has already forgotten its session (no server)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kazoo.exceptions import ConnectionLoss, NodeExistsError

from sidecar.adapters.zookeeper import MetadataStore
from sidecar.core.errors import MetadataUnavailable
from sidecar.core.generations import Boundary, GenerationLog
from sidecar.core.participant import SessionState
from sidecar.core.serialization import generation_to_json


class _SessionLostClient:
    """A lock node exists (someone's), and the session ended between the calls: kazoo
    then reports no client id."""

    client_id = None

    def create(self, *args: object, **kwargs: object) -> None:
        raise NodeExistsError()

    def get(self, path: str) -> tuple[bytes, SimpleNamespace]:
        return b"{}", SimpleNamespace(ephemeralOwner=72, version=0)


async def test_a_lock_attempt_as_the_session_ends_is_unavailable_not_a_bug() -> None:
    store = MetadataStore("127.0.0.1:1")
    store._connection.client = _SessionLostClient()
    store._connection.state = SessionState.CONNECTED  # what the store believed a moment ago
    with pytest.raises(MetadataUnavailable):
        async with store.lock("orders", "sidecar-a", timeout=0):
            pass


class _GenerationsClient:
    """A topic's generation nodes, counting the reads of each."""

    def __init__(self, log: GenerationLog) -> None:
        self.nodes = {
            f"/t/generations/{g.number:010d}": json.dumps(generation_to_json(g)).encode()
            for g in log.generations
        }
        self.reads: list[str] = []

    def get_children(self, path: str) -> list[str]:
        # ZooKeeper names children in no particular order.
        return sorted((p.rsplit("/", 1)[1] for p in self.nodes), reverse=True)

    def get(self, path: str) -> tuple[bytes, SimpleNamespace]:
        self.reads.append(path)
        return self.nodes[path], SimpleNamespace()


def _grown(log: GenerationLog, count: int) -> GenerationLog:
    return log.append(log.next_generation(count, [Boundary(7)] * count))


def test_committed_generations_are_read_once_each() -> None:
    store = MetadataStore("127.0.0.1:1")
    log = _grown(_grown(GenerationLog.start(2), 3), 4)
    client = _GenerationsClient(log)
    store._connection.client = client
    assert store._topics._committed_generations("t", "/t", created=11) == list(log.generations)
    assert len(client.reads) == 3
    # A commit adds generation 3: only it is read.
    longer = _grown(log, 5)
    client.nodes = _GenerationsClient(longer).nodes
    assert store._topics._committed_generations("t", "/t", created=11) == list(longer.generations)
    assert client.reads[3:] == ["/t/generations/0000000003"]
    # The topic made anew under the same name (another czxid): everything is read again.
    client.reads.clear()
    anew = GenerationLog.start(6)
    client.nodes = _GenerationsClient(anew).nodes
    assert store._topics._committed_generations("t", "/t", created=42) == list(anew.generations)
    assert client.reads == ["/t/generations/0000000000"]


class _LocksClient:
    """The locks node, counting how often it is listed; a create can be made to lose
    the connection after it may have reached the server."""

    client_id = (72, b"")

    def __init__(self) -> None:
        self.listed = 0
        self.lose_create = False

    def get_children(self, path: str) -> list[str]:
        self.listed += 1
        return []

    def create(self, path: str, data: bytes, **kwargs: object) -> tuple[str, SimpleNamespace]:
        if self.lose_create:
            raise ConnectionLoss()
        return path, SimpleNamespace(czxid=5)

    def exists(self, path: str) -> SimpleNamespace:
        return SimpleNamespace(czxid=5, version=0)

    def delete(self, path: str, version: int = -1) -> None:
        pass


async def test_leftover_locks_are_looked_for_only_after_an_interruption() -> None:
    # Every sidecar's housekeeping asks each round: an idle sidecar must not list the
    # locks each time, yet one whose attempt was cut off must.
    store = MetadataStore("127.0.0.1:1")
    client = _LocksClient()
    store._connection.client = client
    store._connection.state = SessionState.CONNECTED
    assert await store.release_leftover_locks() == []
    assert client.listed == 1  # at first: a store may start with leftovers
    async with store.lock("orders", "sidecar-a", timeout=0):
        pass
    for _ in range(3):
        await store.release_leftover_locks()
    assert client.listed == 1
    client.lose_create = True
    with pytest.raises(MetadataUnavailable):
        async with store.lock("orders", "sidecar-a", timeout=0):
            pass
    await store.release_leftover_locks()
    await store.release_leftover_locks()
    assert client.listed == 2
