"""``sidecar.adapters.zookeeper.store``: the front class. Its parts share one connection
and one session: nothing is asked of ZooKeeper before the session is up, the root is
every part's, and a lost session reaches the locks. The parts' own behaviour is tested
beside each of them; the store against a real ZooKeeper in
``tests/integration/test_zookeeper_store.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.client import KazooState
from kazoo.protocol.states import KeeperState

from sidecar.adapters.zookeeper import LockHolder, MetadataStore
from sidecar.adapters.zookeeper import operations as operations_module
from sidecar.core.errors import MetadataUnavailable
from sidecar.core.participant import SessionState
from sidecar.core.topics import PendingBarrier


@pytest.mark.parametrize(
    "call",
    [
        lambda store: store.list_topics(),
        lambda store: store.read_topic("orders"),
        lambda store: store.register_sidecar("host-1", {}),
        lambda store: store.live_sidecars(),
        lambda store: store.known_groups(),
        lambda store: store.waits("billing", "orders"),
        lambda store: store.publish_barrier("orders", PendingBarrier(1, 4)),
        lambda store: store.barrier_acks("orders", 1),
        lambda store: store.lock_holder("orders"),
        lambda store: store.read_operation("orders"),
    ],
)
async def test_nothing_is_asked_before_the_session_is_up(
    call: Callable[[MetadataStore], Awaitable[Any]],
) -> None:
    store = MetadataStore("127.0.0.1:1")
    assert store.session_state is SessionState.LOST
    with pytest.raises(MetadataUnavailable, match=r"^ZooKeeper session is lost$"):
        await call(store)


class _Client:
    """Children by path; a lock can be taken; kazoo's listener is kept."""

    client_id = (72, b"")
    connected = True
    client_state = KeeperState.CONNECTED

    def __init__(self) -> None:
        self.listeners: list[Any] = []
        self.listed: list[str] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def start_async(self) -> None:
        pass

    def ensure_path(self, path: str) -> None:
        pass

    def get_children(self, path: str) -> list[str]:
        self.listed.append(path)
        return ["b", "a"]

    def create(self, path: str, data: bytes, **kwargs: object) -> tuple[str, SimpleNamespace]:
        return path, SimpleNamespace(czxid=5)

    def exists(self, path: str) -> None:
        return None


async def test_every_part_reads_under_the_stores_root() -> None:
    store = MetadataStore("127.0.0.1:1", root="/apps/ordered/")
    client = _Client()
    store._connection.client = client
    await store.start(timeout=1)
    assert await store.list_topics() == ["a", "b"]
    assert await store.known_groups() == ["a", "b"]
    assert await store.live_sidecars() == {"a", "b"}
    assert client.listed == [
        "/apps/ordered/topics",
        "/apps/ordered/groups",
        "/apps/ordered/sidecars",
    ]


async def test_a_lost_session_takes_the_held_locks_with_it() -> None:
    store = MetadataStore("127.0.0.1:1")
    client = _Client()
    store._connection.client = client
    heard: list[SessionState] = []
    store.add_session_listener(heard.append)
    await store.start(timeout=1)
    async with store.lock("orders", "host-1", timeout=0):
        assert store.holds_lock("orders")
        for listener in client.listeners:
            await asyncio.to_thread(listener, KazooState.LOST)
        await asyncio.sleep(0)
        assert heard == [SessionState.LOST]
        # The lock node was ephemeral: gone with the session, not held any more.
        assert not store.holds_lock("orders")


def test_the_package_exports_the_store_and_the_lock_holder() -> None:
    assert LockHolder is operations_module.LockHolder
