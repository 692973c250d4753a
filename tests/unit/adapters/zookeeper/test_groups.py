"""``sidecar.adapters.zookeeper.groups``: the names of a group's wait and revocation
nodes and how they are read back, with a fake kazoo client. Against a real ZooKeeper
they are exercised by ``tests/integration/test_zookeeper_store.py`` and
``tests/integration/test_retirement.py``."""

from __future__ import annotations

import pytest
from kazoo.exceptions import NodeExistsError, NoNodeError

from sidecar.adapters.zookeeper.groups import Groups
from sidecar.core.errors import InvalidName
from tests.unit.adapters.zookeeper.support import connection


class _Client:
    """Children by parent path; the nodes made and deleted."""

    def __init__(self, children: dict[str, list[str]] | None = None) -> None:
        self.children = children or {}
        self.ensured: list[str] = []
        self.created: list[tuple[str, bool]] = []
        self.deleted: list[str] = []

    def get_children(self, path: str) -> list[str]:
        if path not in self.children:
            raise NoNodeError()
        return list(self.children[path])

    def ensure_path(self, path: str) -> None:
        self.ensured.append(path)

    def create(self, path: str, data: bytes, ephemeral: bool = False) -> None:
        if (path, ephemeral) in self.created:
            raise NodeExistsError()
        self.created.append((path, ephemeral))

    def delete(self, path: str) -> None:
        if path not in self.deleted and not any(path == p for p, _ in self.created):
            raise NoNodeError()
        self.deleted.append(path)


async def test_a_wait_is_an_ephemeral_node_naming_topic_partition_boundary_instance() -> None:
    client = _Client()
    groups = Groups(connection(client))
    await groups.add_wait("billing", "orders", 3, 1200, "sidecar-a-c1")
    await groups.add_wait("billing", "orders", 3, 1200, "sidecar-a-c1")  # idempotent
    assert client.created == [("/ordered/groups/billing/waits/orders:3:1200:sidecar-a-c1", True)]
    await groups.remove_wait("billing", "orders", 3, 1200, "sidecar-a-c1")
    await groups.remove_wait("billing", "orders", 3, 1200, "sidecar-a-c1")  # gone: fine
    assert client.deleted[0] == "/ordered/groups/billing/waits/orders:3:1200:sidecar-a-c1"


async def test_a_wait_of_an_instance_whose_name_is_no_node_name_is_refused() -> None:
    client = _Client()
    with pytest.raises(InvalidName):
        await Groups(connection(client)).add_wait("billing", "orders", 3, 1200, "a/../b")
    assert client.created == []


async def test_waits_are_the_highest_boundary_per_partition_of_the_topic() -> None:
    client = _Client(
        {
            "/ordered/groups/billing/waits": [
                "orders:3:1200:sidecar-a-c1",
                "orders:3:900:sidecar-b-c1",
                "orders:0:5:sidecar-a-c2",
                "orders.eu:3:9999:sidecar-a-c1",  # another topic
                "orders:3:1500:sidecar-c-c1",
            ]
        }
    )
    assert await Groups(connection(client)).waits("billing", "orders") == {3: 1500, 0: 5}


async def test_a_group_nobody_waited_in_has_no_waits() -> None:
    assert await Groups(connection(_Client())).waits("billing", "orders") == {}


async def test_acknowledged_revocations_of_the_topic_are_partition_and_generation() -> None:
    client = _Client({"/ordered/groups/billing/revoked": ["orders:2:7", "orders:0:7", "other:1:3"]})
    groups = Groups(connection(client))
    assert await groups.acknowledged_revocations("billing", "orders") == {(2, 7), (0, 7)}
    await groups.acknowledge_revocation("billing", "orders", 5, 8)
    assert client.ensured == ["/ordered/groups/billing/revoked/orders:5:8"]
    assert await groups.acknowledged_revocations("fresh", "orders") == set()


async def test_known_groups_are_listed_in_order() -> None:
    client = _Client({"/ordered/groups": ["payments", "billing", "audit"]})
    assert await Groups(connection(client)).known_groups() == ["audit", "billing", "payments"]
