"""``sidecar.adapters.zookeeper.topics``: the formats of a topic's nodes (its partitions
node and its confirmed truncations) and the generation log read a node at a time, with
a fake kazoo client. Creating, reading and watching topics against a real ZooKeeper
is tested in ``tests/integration/test_zookeeper_store.py``."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.exceptions import NoNodeError

from sidecar.adapters.zookeeper import MetadataStore
from sidecar.adapters.zookeeper.operations import Operations
from sidecar.adapters.zookeeper.topics import (
    Topics,
    _delete_after_from_json,
    encode_partitions,
)
from sidecar.core.errors import UnknownTopic
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode
from sidecar.core.serialization import generation_to_json
from tests.unit.adapters.zookeeper.support import Answer, connection


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

    def get_async(self, path: str) -> Answer:
        self.reads.append(path)
        return Answer(lambda: (self.nodes[path], SimpleNamespace()))

    def exists_async(self, path: str) -> Answer:
        self.reads.append(f"exists {path}")
        return Answer(lambda: SimpleNamespace(mzxid=5))


def _read_log(store: MetadataStore, client: _GenerationsClient, created: int) -> list[Any]:
    """The generations ``Topics._committed_generations`` returns, having checked that it
    asked for the topic node's stat after every generation it read."""
    generations, after = store._topics._committed_generations(
        "t", "/t", created, client.get_children("/t/generations")
    )
    assert after.mzxid == 5
    assert client.reads[-1] == "exists /t"
    client.reads.pop()
    return generations


def _grown(log: GenerationLog, count: int) -> GenerationLog:
    return log.append(log.next_generation(count, [Boundary(7)] * count))


def test_committed_generations_are_read_once_each() -> None:
    store = MetadataStore("127.0.0.1:1")
    log = _grown(_grown(GenerationLog.start(2), 3), 4)
    client = _GenerationsClient(log)
    store._connection.client = client
    assert _read_log(store, client, created=11) == list(log.generations)
    assert len(client.reads) == 3
    # A commit adds generation 3: only it is read.
    longer = _grown(log, 5)
    client.nodes = _GenerationsClient(longer).nodes
    assert _read_log(store, client, created=11) == list(longer.generations)
    assert client.reads[3:] == ["/t/generations/0000000003"]
    # The topic made anew under the same name (another czxid): everything is read again.
    client.reads.clear()
    anew = GenerationLog.start(6)
    client.nodes = _GenerationsClient(anew).nodes
    assert _read_log(store, client, created=42) == list(anew.generations)
    assert client.reads == ["/t/generations/0000000000"]


def test_the_partitions_node_holds_modes_and_delete_after_times() -> None:
    data = encode_partitions(
        (PartitionMode.READ_WRITE, PartitionMode.READ_ONLY, PartitionMode.REMOVED),
        (None, 1700000000.5, 1700000000.0),
    )
    assert json.loads(data) == {
        "modes": ["read_write", "read_only", "removed"],
        "delete_after": [None, 1700000000.5, 1700000000.0],
    }


def test_delete_after_times_are_read_back_as_floats() -> None:
    written = json.loads(encode_partitions((PartitionMode.READ_ONLY,) * 3, (None, 5.0, 7.25)))
    assert _delete_after_from_json(written["delete_after"]) == (None, 5.0, 7.25)
    # An integral time written by another client is a time too.
    assert _delete_after_from_json([3]) == (3.0,)


@pytest.mark.parametrize("raw", [None, {"0": 1.0}, "1.0", [True], ["1.0"], [[1.0]]])
def test_a_malformed_delete_after_is_refused(raw: Any) -> None:
    with pytest.raises(ValueError, match="malformed delete_after"):
        _delete_after_from_json(raw)


class _TruncationsClient:
    def __init__(self, nodes: dict[str, bytes]) -> None:
        self.nodes = nodes

    def get(self, path: str) -> tuple[bytes, SimpleNamespace]:
        if path not in self.nodes:
            raise NoNodeError()
        return self.nodes[path], SimpleNamespace(version=0)

    def exists(self, path: str) -> SimpleNamespace | None:
        return SimpleNamespace(version=0) if path in self.nodes else None


def _topics(client: Any) -> Topics:
    made = connection(client)
    return Topics(made, Operations(made, lock_poll_s=0.01))


async def test_confirmed_truncations_are_read_as_tuples() -> None:
    client = _TruncationsClient(
        {"/ordered/topics/t/truncations": b'{"confirmed":[[2,0,100,4],[3,1,7,5]]}'}
    )
    assert await _topics(client).confirmed_truncations("t") == {(2, 0, 100, 4), (3, 1, 7, 5)}


async def test_a_topic_without_confirmed_truncations_has_none() -> None:
    client = _TruncationsClient({"/ordered/topics/t": b"{}"})
    assert await _topics(client).confirmed_truncations("t") == frozenset()


async def test_confirming_a_truncation_of_an_unmanaged_topic_is_refused() -> None:
    with pytest.raises(UnknownTopic, match="topic 'gone' is not managed"):
        await _topics(_TruncationsClient({})).confirm_truncations("gone", [(1, 0, 5, 2)])
