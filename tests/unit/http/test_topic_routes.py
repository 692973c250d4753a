"""REST Proxy v2's discovery routes (``sidecar.http.topic_routes``) on a stand-in topic
directory: the shape of each answer, the ordered extensions of a managed topic, what the
routes ask the directory, and the errors it raises."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sidecar.adapters.kafka import PartitionInfo
from sidecar.core.errors import KafkaUnavailable, SidecarError, UnknownPartition, UnknownTopic
from sidecar.core.generations import PartitionMode
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.http.error_map import errors_middleware
from sidecar.http.produce_codec import V2_RESPONSE_CONTENT_TYPE
from sidecar.http.topic_routes import TOPICS_KEY, add_routes
from sidecar.service.topics import PartitionView, TopicDirectory, TopicView
from tests.unit.service.fakes import expanded_log

Client = TestClient[web.Request, web.Application]

# Partition 0 led by 1 with 2 out of sync; partition 1 without a leader.
P0 = PartitionInfo(0, leader=1, replicas=(1, 2, 3), in_sync=(1, 3))
P1 = PartitionInfo(1, leader=-1, replicas=(2, 3), in_sync=())
# Kafka's third partition of "orders", beyond the managed topic's own two.
P2 = PartitionInfo(2, leader=3, replicas=(3,), in_sync=(3,))

P0_BODY = {
    "partition": 0,
    "leader": 1,
    "replicas": [
        {"broker": 1, "leader": True, "in_sync": True},
        {"broker": 2, "leader": False, "in_sync": False},
        {"broker": 3, "leader": False, "in_sync": True},
    ],
}
P1_BODY = {
    "partition": 1,
    "leader": -1,
    "replicas": [
        {"broker": 2, "leader": False, "in_sync": False},
        {"broker": 3, "leader": False, "in_sync": False},
    ],
}
P2_BODY = {
    "partition": 2,
    "leader": 3,
    "replicas": [{"broker": 3, "leader": True, "in_sync": True}],
}

# Expanded once from one partition to two: generation 1, two undeleted partitions.
MANAGED = TopicState(
    TopicConfig("orders", 1, 3),
    expanded_log(5),
    (PartitionMode.READ_WRITE, PartitionMode.READ_ONLY),
)


@dataclasses.dataclass
class _Topic:
    state: TopicState | None
    views: tuple[PartitionView, ...]
    configs: Mapping[str, str | None]


@dataclasses.dataclass
class _Directory:
    """A topic directory over fixed topics; keeps every question it was asked."""

    topics: dict[str, _Topic]
    broker_ids: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 3])
    asked: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    error: SidecarError | None = None

    def _find(self, name: str) -> _Topic:
        if self.error is not None:
            raise self.error
        found = self.topics.get(name)
        if found is None:
            raise UnknownTopic(f"topic {name} does not exist")
        return found

    async def names(self) -> list[str]:
        self.asked.append(("names",))
        if self.error is not None:
            raise self.error
        return list(self.topics)

    async def brokers(self) -> list[int]:
        self.asked.append(("brokers",))
        return self.broker_ids

    async def topic(self, name: str) -> TopicView:
        self.asked.append(("topic", name))
        found = self._find(name)
        return TopicView(name, found.configs, found.views, found.state)

    async def partitions(self, name: str) -> tuple[TopicState | None, tuple[PartitionView, ...]]:
        self.asked.append(("partitions", name))
        found = self._find(name)
        return found.state, found.views

    async def partition(self, name: str, partition: int) -> tuple[TopicState | None, PartitionView]:
        self.asked.append(("partition", name, partition))
        found = self._find(name)
        for view in found.views:
            if view.info.partition == partition:
                return found.state, view
        raise UnknownPartition(f"partition {partition} of {name} does not exist")


@pytest.fixture
def directory() -> _Directory:
    return _Directory(
        {
            # Listed in this order on purpose: the route must not reorder the names.
            "plain": _Topic(
                None,
                (PartitionView(P0, None), PartitionView(P1, None)),
                {"cleanup.policy": "delete", "retention.ms": None},
            ),
            "orders": _Topic(
                MANAGED,
                (
                    PartitionView(P0, PartitionMode.READ_WRITE),
                    PartitionView(P1, PartitionMode.READ_ONLY),
                    PartitionView(P2, None),
                ),
                {"cleanup.policy": "compact"},
            ),
        }
    )


@pytest.fixture
async def client(directory: _Directory) -> AsyncIterator[Client]:
    app = web.Application(middlewares=[errors_middleware])
    add_routes(app, cast(TopicDirectory, directory))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def _get(client: Client, path: str) -> tuple[int, Any]:
    async with client.get(path) as response:
        assert response.content_type == V2_RESPONSE_CONTENT_TYPE, path
        return response.status, await response.json(content_type=None)


def test_add_routes_keeps_the_directory_for_the_other_routes_to_share(
    directory: _Directory,
) -> None:
    app = web.Application()
    add_routes(app, cast(TopicDirectory, directory))
    kept: object = app[TOPICS_KEY]
    assert kept is directory


async def test_the_topic_list_is_the_directorys_names_as_given(
    client: Client, directory: _Directory
) -> None:
    assert await _get(client, "/topics") == (200, ["plain", "orders"])
    assert directory.asked == [("names",)]


async def test_the_broker_list_is_an_object_of_broker_ids(
    client: Client, directory: _Directory
) -> None:
    directory.broker_ids = [4, 7]
    assert await _get(client, "/brokers") == (200, {"brokers": [4, 7]})


async def test_an_unmanaged_topic_has_no_generation_and_its_partitions_no_mode(
    client: Client, directory: _Directory
) -> None:
    assert await _get(client, "/topics/plain") == (
        200,
        {
            "name": "plain",
            "configs": {"cleanup.policy": "delete", "retention.ms": None},
            "partitions": [P0_BODY, P1_BODY],
            "managed": False,
        },
    )
    assert directory.asked == [("topic", "plain")]


async def test_a_managed_topic_has_its_generation_count_and_each_partitions_mode(
    client: Client,
) -> None:
    assert await _get(client, "/topics/orders") == (
        200,
        {
            "name": "orders",
            "configs": {"cleanup.policy": "compact"},
            "partitions": [
                P0_BODY | {"mode": "read_write"},
                P1_BODY | {"mode": "read_only"},
                # Kafka has it, the managed topic does not: listed, with a null mode.
                P2_BODY | {"mode": None},
            ],
            "managed": True,
            "generation": 1,
            "undeleted_count": 2,
        },
    )


async def test_the_partition_list_has_modes_only_for_a_managed_topic(
    client: Client, directory: _Directory
) -> None:
    assert await _get(client, "/topics/plain/partitions") == (200, [P0_BODY, P1_BODY])
    assert await _get(client, "/topics/orders/partitions") == (
        200,
        [
            P0_BODY | {"mode": "read_write"},
            P1_BODY | {"mode": "read_only"},
            P2_BODY | {"mode": None},
        ],
    )
    assert directory.asked == [("partitions", "plain"), ("partitions", "orders")]


async def test_one_partition_is_asked_for_by_its_number(
    client: Client, directory: _Directory
) -> None:
    assert await _get(client, "/topics/orders/partitions/1") == (
        200,
        P1_BODY | {"mode": "read_only"},
    )
    assert await _get(client, "/topics/plain/partitions/0") == (200, P0_BODY)
    assert directory.asked == [("partition", "orders", 1), ("partition", "plain", 0)]


@pytest.mark.parametrize("raw", ["x", "-1", "1.0", "2147483648", "99999999999", "%D9%A3"])
async def test_a_partition_that_is_not_a_partition_number_is_404_before_the_directory(
    client: Client, directory: _Directory, raw: str
) -> None:
    # %D9%A3 is ARABIC-INDIC DIGIT THREE: a digit to str.isdigit, no partition number.
    status, body = await _get(client, f"/topics/orders/partitions/{raw}")
    assert (status, body["error_code"]) == (404, 40402)
    assert "is not a partition number" in body["message"]
    assert directory.asked == []


async def test_a_partition_the_topic_does_not_have_is_the_directorys_404(
    client: Client,
) -> None:
    status, body = await _get(client, "/topics/orders/partitions/7")
    assert (status, body) == (
        404,
        {"error_code": 40402, "message": "partition 7 of orders does not exist"},
    )


@pytest.mark.parametrize(
    "path", ["/topics/nosuch", "/topics/nosuch/partitions", "/topics/nosuch/partitions/0"]
)
async def test_an_unknown_topic_is_404_40401_on_every_topic_route(
    client: Client, path: str
) -> None:
    assert await _get(client, path) == (
        404,
        {"error_code": 40401, "message": "topic nosuch does not exist"},
    )


@pytest.mark.parametrize("path", ["/topics", "/topics/orders", "/topics/orders/partitions/0"])
async def test_kafka_being_unavailable_is_a_retriable_503(
    client: Client, directory: _Directory, path: str
) -> None:
    directory.error = KafkaUnavailable("no broker answered")
    assert await _get(client, path) == (
        503,
        {"error_code": 50002, "message": "no broker answered", "retriable": True},
    )


async def test_the_routes_are_read_only(client: Client, directory: _Directory) -> None:
    for method, path in (("POST", "/brokers"), ("DELETE", "/topics/orders")):
        async with client.request(method, path) as response:
            assert response.status == 405, path
            assert "GET" in response.headers["Allow"]
    assert directory.asked == []
