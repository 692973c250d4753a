"""``sidecar.adapters.zookeeper.sidecars``: what a registration writes (one transaction:
the sidecar's ephemeral node and its producers), and how the live producers are read
back, with a fake kazoo client. Registration across an expired session against a real
ZooKeeper is tested in ``tests/integration/test_zookeeper_store.py``."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.exceptions import NodeExistsError, NoNodeError

from sidecar.adapters.zookeeper.sidecars import Sidecars
from sidecar.core.errors import InvalidName, MetadataUnavailable
from sidecar.core.procedures import TransactionalId
from tests.unit.adapters.zookeeper.support import Answer, connection

SESSION = 72


class _Transaction:
    def __init__(self, client: _Client) -> None:
        self.client = client
        self.operations: list[tuple[Any, ...]] = []

    def create(self, path: str, data: bytes = b"", ephemeral: bool = False) -> None:
        self.operations.append(("create", path, data, ephemeral))

    def set_data(self, path: str, data: bytes, version: int = -1) -> None:
        self.operations.append(("set_data", path, data, version))

    def delete(self, path: str, version: int = -1) -> None:
        self.operations.append(("delete", path, version))

    def commit(self) -> list[Any]:
        self.client.committed.append(self.operations)
        return [self.client.fail] * len(self.operations) if self.client.fail else []


class _Client:
    client_id = (SESSION, b"")

    def __init__(self, nodes: dict[str, tuple[bytes, int]] | None = None) -> None:
        self.nodes = nodes or {}
        """Path -> (data, ephemeral owner)."""
        self.committed: list[list[tuple[Any, ...]]] = []
        self.fail: Exception | None = None

    def transaction(self) -> _Transaction:
        return _Transaction(self)

    def exists(self, path: str) -> SimpleNamespace | None:
        if path not in self.nodes:
            return None
        return SimpleNamespace(ephemeralOwner=self.nodes[path][1], version=4)

    def get(self, path: str) -> tuple[bytes, SimpleNamespace]:
        if path not in self.nodes:
            raise NoNodeError()
        return self.nodes[path][0], SimpleNamespace()

    def get_async(self, path: str) -> Answer:
        return Answer(lambda: self.get(path))

    def get_children(self, path: str) -> list[str]:
        prefix = path + "/"
        return [p[len(prefix) :] for p in self.nodes if p.startswith(prefix)]


IDS = (TransactionalId("ordered-host-1-0"), TransactionalId("ordered-host-1-1"))


async def test_a_first_registration_creates_the_ephemeral_node_and_the_producers() -> None:
    client = _Client({"/ordered/producers/ordered-host-1-1": (b"{}", 0)})  # known already
    await Sidecars(connection(client)).register_sidecar("host-1", {"port": 8082}, IDS)
    ((create, producer),) = client.committed
    assert create[:2] == ("create", "/ordered/sidecars/host-1")
    assert create[3] is True  # ephemeral
    assert json.loads(create[2]) == {
        "port": 8082,
        "transactional_ids": ["ordered-host-1-0", "ordered-host-1-1"],
        # What sidecars from before transaction lanes read: the first lane.
        "transactional_id": "ordered-host-1-0",
    }
    assert producer == (
        "create",
        "/ordered/producers/ordered-host-1-0",
        b'{"sidecar":"host-1"}',
        False,
    )


async def test_registering_again_in_the_same_session_replaces_the_info() -> None:
    client = _Client({"/ordered/sidecars/host-1": (b"{}", SESSION)})
    await Sidecars(connection(client)).register_sidecar("host-1", {"port": 9000})
    ((operation,),) = client.committed
    assert operation[:2] == ("set_data", "/ordered/sidecars/host-1")
    assert operation[3] == 4  # compare-and-set on the version read
    assert json.loads(operation[2])["transactional_id"] is None


async def test_a_node_left_by_an_older_session_is_replaced_by_this_ones() -> None:
    client = _Client({"/ordered/sidecars/host-1": (b"{}", 41)})
    await Sidecars(connection(client)).register_sidecar("host-1", {})
    ((delete, create),) = client.committed
    assert delete == ("delete", "/ordered/sidecars/host-1", 4)
    assert create[0] == "create"
    assert create[3] is True


async def test_a_registration_that_keeps_racing_gives_up_after_the_attempts() -> None:
    client = _Client()
    client.fail = NodeExistsError()
    with pytest.raises(MetadataUnavailable, match="registering host-1 kept racing"):
        await Sidecars(connection(client, attempts=3)).register_sidecar("host-1", {})
    assert len(client.committed) == 3


async def test_what_is_prepared_is_registered_again_in_a_new_session() -> None:
    client = _Client()
    sidecars = Sidecars(connection(client))
    sidecars.prepare_registration("host-1", {"port": 8082}, IDS[:1])
    assert client.committed == []  # no IO when prepared
    await sidecars.reregister()
    await sidecars.reregister()
    assert [ops[0][1] for ops in client.committed] == ["/ordered/sidecars/host-1"] * 2


def test_names_are_refused_when_prepared_not_at_a_later_reregistration() -> None:
    sidecars = Sidecars(connection(_Client()))
    with pytest.raises(InvalidName):
        sidecars.prepare_registration("a/b", {}, ())
    with pytest.raises(InvalidName):
        sidecars.prepare_registration("host-1", {}, (TransactionalId("x/y"),))


async def test_the_live_producers_are_every_lane_of_every_registration() -> None:
    client = _Client(
        {
            "/ordered/sidecars/host-1": (b'{"transactional_ids":["a-0","a-1"]}', 1),
            # A sidecar from before lanes names one id only.
            "/ordered/sidecars/old": (b'{"transactional_id":"old-0"}', 2),
            "/ordered/sidecars/odd": (b'["not", "an", "object"]', 3),
            "/ordered/sidecars/mixed": (b'{"transactional_ids":["m-0",7,null]}', 4),
        }
    )
    sidecars = Sidecars(connection(client))
    assert await sidecars.live_producers() == {"a-0", "a-1", "old-0", "m-0"}
    assert await sidecars.live_sidecars() == {"host-1", "old", "odd", "mixed"}
