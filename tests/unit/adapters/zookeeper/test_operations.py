"""``sidecar.adapters.zookeeper.operations``: the topics' change locks and journals, with
a fake kazoo client: a lock attempt as the session ends, leftover locks looked for only
after an interruption, and who a lock node says holds it. The locks and journals
against a real ZooKeeper (contention, take-over, a pause during an attempt) are tested
in ``tests/integration/test_zookeeper_store.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kazoo.exceptions import ConnectionLoss, NodeExistsError

from sidecar.adapters.zookeeper import MetadataStore
from sidecar.adapters.zookeeper.operations import LockHolder, Operations, _lock_holder
from sidecar.core.errors import MetadataUnavailable, OperationInProgress
from sidecar.core.participant import SessionState
from tests.unit.adapters.zookeeper.support import connection, stat


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


def test_a_lock_node_names_its_holder_purpose_and_time() -> None:
    data = b'{"owner":"sidecar-b","purpose":"retirement","acquired_at":1700000000.5}'
    assert _lock_holder(data, stat(ctime=0)) == LockHolder("sidecar-b", "retirement", 1700000000.5)


@pytest.mark.parametrize("data", [b"", b"not json", b"{}", b'{"owner":"a","purpose":"b"}'])
def test_an_unreadable_lock_node_is_held_by_someone_unknown_since_its_creation(
    data: bytes,
) -> None:
    # ctime is in milliseconds; acquired_at in seconds.
    assert _lock_holder(data, stat(ctime=1_700_000_000_250)) == LockHolder(
        "unknown", "unknown", 1_700_000_000.25
    )


class _HeldClient:
    """One lock node, someone else's."""

    client_id = (72, b"")

    def __init__(self, owner: int) -> None:
        self.owner = owner
        self.deleted: list[str] = []

    def create(self, path: str, data: bytes, **kwargs: object) -> None:
        raise NodeExistsError()

    def get(self, path: str) -> tuple[bytes, SimpleNamespace]:
        data = b'{"owner":"sidecar-b","purpose":"change","acquired_at":0}'
        return data, SimpleNamespace(ephemeralOwner=self.owner, version=3, ctime=0)

    def delete(self, path: str, version: int = -1) -> None:
        self.deleted.append(path)


async def test_a_lock_held_by_another_session_is_refused_naming_the_holder() -> None:
    client = _HeldClient(owner=99)
    operations = Operations(connection(client), lock_poll_s=0.01)
    with pytest.raises(OperationInProgress, match=r"^sidecar-b holds the change lock of 'orders' "):
        async with operations.lock("orders", "sidecar-a", timeout=0):
            pass
    assert client.deleted == []
    assert await operations.lock_holder("orders") == LockHolder("sidecar-b", "change", 0.0)


def test_a_lock_node_of_this_session_not_held_is_a_leftover_and_deleted() -> None:
    client = _HeldClient(owner=72)  # this session's, yet this store holds no lock
    operations = Operations(connection(client), lock_poll_s=0.01)
    holder = operations._try_lock("orders", b"{}")
    assert holder is not None
    assert holder.owner == "nobody"
    assert client.deleted == ["/ordered/locks/orders"]
    assert not operations.holds_lock("orders")
