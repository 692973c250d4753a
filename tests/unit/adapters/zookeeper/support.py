"""What the ZooKeeper adapter's unit tests share: a connection whose kazoo client is a
fake (it never connects), believed CONNECTED, and a kazoo node stat."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)

from sidecar.adapters.zookeeper.connection import ZooKeeperConnection
from sidecar.adapters.zookeeper.operations import Operations
from sidecar.adapters.zookeeper.topics import Topics, encode_generation, encode_partitions
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.participant import SessionState
from sidecar.core.serialization import config_to_json
from sidecar.core.topics import TopicConfig


def connection(client: Any, *, root: str = "/ordered", attempts: int = 5) -> ZooKeeperConnection:
    """A connection to nothing, with ``client`` in place of kazoo's, as if its session
    were up (kazoo's client is made, never started)."""
    made = ZooKeeperConnection(
        "127.0.0.1:1",
        root=root,
        session_timeout_s=10.0,
        transaction_attempts=attempts,
        security=None,
    )
    made.client = client
    made.state = SessionState.CONNECTED
    return made


def stat(**fields: Any) -> SimpleNamespace:
    """A kazoo ZnodeStat with only the fields a test gives."""
    return SimpleNamespace(**fields)


class Answer:
    """kazoo's IAsyncResult of a request a fake client answers at once: ``get`` returns
    the value or raises what the request raised."""

    def __init__(self, request: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: Exception | None = None
        try:
            self._value = request()
        except Exception as exc:
            self._error = exc

    def get(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class MemoryZooKeeper:
    """The part of kazoo's client the topic reads and the compaction use, over nodes in
    memory: versions, modification order (mzxid) and multi-op transactions that apply
    all of their operations or none (as ZooKeeper's multi does)."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, SimpleNamespace]] = {}
        self._zxid = 0
        self.before_commit: list[Any] = []
        """Callables run once each, in order, at the start of the next commits: what
        another writer does between a transaction's reads and its commit."""

    def _stat(self, version: int, czxid: int | None = None) -> SimpleNamespace:
        self._zxid += 1
        return SimpleNamespace(
            version=version,
            mzxid=self._zxid,
            czxid=self._zxid if czxid is None else czxid,
            ephemeralOwner=0,
        )

    def create(self, path: str, value: bytes = b"", **_: Any) -> str:
        if path in self.nodes:
            raise NodeExistsError()
        self.nodes[path] = (value, self._stat(0))
        return path

    def get(self, path: str, watch: Any = None) -> tuple[bytes, SimpleNamespace]:
        if path not in self.nodes:
            raise NoNodeError()
        return self.nodes[path]

    def exists(self, path: str, watch: Any = None) -> SimpleNamespace | None:
        return self.nodes[path][1] if path in self.nodes else None

    def get_children(self, path: str, watch: Any = None) -> list[str]:
        if path not in self.nodes:
            raise NoNodeError()
        prefix = path.rstrip("/") + "/"
        names = (p[len(prefix) :] for p in self.nodes if p.startswith(prefix))
        return [name for name in names if "/" not in name]

    def get_async(self, path: str, watch: Any = None) -> Answer:
        return Answer(lambda: self.get(path, watch))

    def exists_async(self, path: str, watch: Any = None) -> Answer:
        return Answer(lambda: self.exists(path, watch))

    def get_children_async(self, path: str, watch: Any = None) -> Answer:
        return Answer(lambda: self.get_children(path, watch))

    def set(self, path: str, value: bytes, version: int = -1) -> SimpleNamespace:
        if path not in self.nodes:
            raise NoNodeError()
        stat = self.nodes[path][1]
        if version != -1 and version != stat.version:
            raise BadVersionError()
        self.nodes[path] = (value, self._stat(stat.version + 1, stat.czxid))
        return self.nodes[path][1]

    def delete(self, path: str, version: int = -1) -> None:
        if path not in self.nodes:
            raise NoNodeError()
        if version != -1 and version != self.nodes[path][1].version:
            raise BadVersionError()
        if self.get_children(path):
            raise NotEmptyError()
        del self.nodes[path]

    def transaction(self) -> MemoryTransaction:
        return MemoryTransaction(self)


class MemoryTransaction:
    """A multi-op of ``MemoryZooKeeper``: checked against a copy, then applied whole."""

    def __init__(self, client: MemoryZooKeeper) -> None:
        self._client = client
        self._operations: list[tuple[str, tuple[Any, ...]]] = []

    def create(self, path: str, value: bytes = b"") -> None:
        self._operations.append(("create", (path, value)))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self._operations.append(("set", (path, value, version)))

    def delete(self, path: str, version: int = -1) -> None:
        self._operations.append(("delete", (path, version)))

    def check(self, path: str, version: int) -> None:
        self._operations.append(("check", (path, version)))

    def commit(self) -> list[Any]:
        while self._client.before_commit:
            self._client.before_commit.pop(0)()
        saved = dict(self._client.nodes)
        results: list[Any] = []
        for name, args in self._operations:
            try:
                if name == "check":
                    path, version = args
                    if path not in self._client.nodes:
                        raise NoNodeError()
                    if self._client.nodes[path][1].version != version:
                        raise BadVersionError()
                    results.append(True)
                else:
                    results.append(getattr(self._client, name)(*args))
            except Exception as exc:  # every failure rolls the whole transaction back
                self._client.nodes = saved
                return [
                    exc if index == len(results) else RolledBackError()
                    for index in range(len(self._operations))
                ]
        return results


def stored_topic(log: GenerationLog, topic: str = "t") -> tuple[MemoryZooKeeper, Topics]:
    """``log`` stored in ZooKeeper in memory as the sidecars store a topic's (under the
    default root), and the ``Topics`` part of a store reading it."""
    client = MemoryZooKeeper()
    path = f"/ordered/topics/{topic}"
    config = TopicConfig(topic, log.initial_count, 1)
    head = {"config": config_to_json(config), "current_generation": log.current.number}
    client.create(path, json.dumps(head).encode())
    client.create(f"{path}/generations")
    for generation in log.generations:
        client.create(f"{path}/generations/{generation.number:010d}", encode_generation(generation))
    modes = (PartitionMode.READ_WRITE,) * log.current.physical_count
    client.create(f"{path}/partitions", encode_partitions(modes, (None,) * len(modes)))
    return client, memory_topics(client)


def memory_topics(client: MemoryZooKeeper) -> Topics:
    """The ``Topics`` part of a store over ``client``."""
    made = connection(client)
    return Topics(made, Operations(made, lock_poll_s=0.01))
