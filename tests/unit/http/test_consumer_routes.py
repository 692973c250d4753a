"""The consumer API's handlers (``sidecar.http.consumer_routes``) on stand-in services:
what each route hands the consumer instance (settings, partitions, offsets, positions),
how it answers, and what it refuses before the instance is touched. Records responses:
their order, content type, headers, and records put back when they cannot be sent."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sidecar.config import ConsumerSettings
from sidecar.core.consume import TopicPartition
from sidecar.core.errors import (
    ConsumerStateConflict,
    SidecarError,
    UnknownConsumerInstance,
    UnknownPartition,
    UnknownTopic,
)
from sidecar.core.handoff import AssignmentChange, AssignmentNotice, HandoffEvent, HandoffKind
from sidecar.http.consumer_routes import CONSUMERS_KEY, add_routes
from sidecar.http.error_map import errors_middleware
from sidecar.http.produce_codec import V2_RESPONSE_CONTENT_TYPE
from sidecar.http.topic_routes import TOPICS_KEY
from sidecar.service.consumers import Consumers
from sidecar.service.instance import InstanceConfig
from sidecar.service.release import PollResult
from sidecar.service.topics import TopicDirectory
from tests.unit.service.fakes import Record

Client = TestClient[web.Request, web.Application]

V2 = {"Content-Type": V2_RESPONSE_CONTENT_TYPE}
INSTANCE = "/consumers/billing/instances/b1"
MAX_POLL_BYTES = 4096
# aiohttp's client would send application/octet-stream with a POST that has no body.
NO_TYPE = ("Content-Type",)


@dataclasses.dataclass
class _Instance:
    """A consumer instance that keeps every call; ``fail`` makes each call raise it."""

    config: InstanceConfig
    calls: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    topics: list[str] = dataclasses.field(default_factory=list)
    assigned: list[TopicPartition] = dataclasses.field(default_factory=list)
    stored: dict[TopicPartition, int] = dataclasses.field(default_factory=dict)
    polled: PollResult = dataclasses.field(default_factory=lambda: PollResult([], []))
    deliveries: list[str] = dataclasses.field(default_factory=list)
    """"sent" or "put back", one per delivery, as ``ConsumerInstance.delivery`` ends it."""
    polling: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    answer: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    delivered: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    fail: SidecarError | None = None

    def __post_init__(self) -> None:
        self.answer.set()

    def _call(self, *call: Any) -> None:
        self.calls.append(call)
        if self.fail is not None:
            raise self.fail

    async def subscribe(self, topics: Sequence[str] | None, pattern: str | None) -> None:
        self._call("subscribe", topics, pattern)

    def subscribed_topics(self) -> list[str]:
        self._call("subscribed_topics")
        return self.topics

    async def unsubscribe(self) -> None:
        self._call("unsubscribe")

    async def assign_manually(self, partitions: Sequence[TopicPartition]) -> None:
        self._call("assign_manually", list(partitions))

    def assignment(self) -> list[TopicPartition]:
        self._call("assignment")
        return self.assigned

    @contextlib.asynccontextmanager
    async def delivery(self, timeout_s: float, max_bytes: int | None) -> AsyncIterator[PollResult]:
        self._call("delivery", timeout_s, max_bytes)
        self.polling.set()
        await self.answer.wait()
        try:
            yield self.polled
        except BaseException:
            self.deliveries.append("put back")
            raise
        finally:
            self.delivered.set()
        self.deliveries.append("sent")

    async def commit(self, offsets: Mapping[TopicPartition, int] | None) -> None:
        self._call("commit", None if offsets is None else dict(offsets))

    async def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        self._call("committed", list(partitions))
        return {tp: self.stored[tp] for tp in partitions if tp in self.stored}

    async def seek_positions(
        self, offsets: Mapping[TopicPartition, int], timestamps: Mapping[TopicPartition, int]
    ) -> None:
        self._call("seek_positions", dict(offsets), dict(timestamps))

    async def seek_to(self, partitions: Sequence[TopicPartition], *, beginning: bool) -> None:
        self._call("seek_to", list(partitions), beginning)

    async def acknowledge_events(self, event_ids: Iterable[int]) -> None:
        self._call("acknowledge_events", event_ids)


class _Consumers:
    """Consumer instances by (group, name), as ``Consumers`` keeps them."""

    def __init__(self) -> None:
        self.instances: dict[tuple[str, str], _Instance] = {}
        self.created: list[InstanceConfig] = []
        self.deleted: list[tuple[str, str]] = []
        self.context = SimpleNamespace(settings=ConsumerSettings(max_poll_bytes=MAX_POLL_BYTES))

    def add(self, config: InstanceConfig) -> _Instance:
        instance = _Instance(config)
        self.instances[(config.group, config.name)] = instance
        return instance

    async def create(self, config: InstanceConfig) -> _Instance:
        if (config.group, config.name) in self.instances:
            raise ConsumerStateConflict(f"consumer instance {config.name} already exists")
        self.created.append(config)
        return self.add(config)

    def get(self, group: str, name: str) -> _Instance:
        found = self.instances.get((group, name))
        if found is None:
            raise UnknownConsumerInstance(f"consumer instance {name} not found in group {group}")
        return found

    async def delete(self, group: str, name: str) -> None:
        self.get(group, name)
        del self.instances[(group, name)]
        self.deleted.append((group, name))


class _Directory:
    """Kafka's partition counts, for the routes' existence check; keeps what it checked."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = dict(counts)
        self.checked: list[list[tuple[str, int]]] = []

    async def check_partitions_exist(self, partitions: Iterable[tuple[str, int]]) -> None:
        named = list(partitions)
        self.checked.append(named)
        for topic, partition in named:
            if topic not in self.counts:
                raise UnknownTopic(f"topic {topic} does not exist")
            if partition >= self.counts[topic]:
                raise UnknownPartition(f"partition {partition} of {topic} does not exist")


@dataclasses.dataclass
class _Api:
    consumers: _Consumers
    directory: _Directory
    instance: _Instance
    client: Client


@pytest.fixture
async def api() -> AsyncIterator[_Api]:
    consumers = _Consumers()
    instance = consumers.add(InstanceConfig("billing", "b1", "binary", poll_timeout_ms=2000))
    directory = _Directory({"orders": 2, "payments": 1})
    async with TestClient(TestServer(_app(consumers, directory))) as client:
        yield _Api(consumers, directory, instance, client)


def _app(consumers: _Consumers, directory: _Directory) -> web.Application:
    app = web.Application(middlewares=[errors_middleware])
    app[TOPICS_KEY] = cast(TopicDirectory, directory)
    add_routes(app, cast(Consumers, consumers))
    return app


async def _call(
    api: _Api,
    method: str,
    path: str,
    body: object = None,
    headers: Mapping[str, str] = V2,
) -> tuple[int, Any]:
    """Status and JSON body (None for none) of one request with ``body`` as JSON."""
    data = None if body is None else json.dumps(body).encode()
    async with api.client.request(method, path, data=data, headers=dict(headers)) as response:
        raw = await response.read()
        return response.status, json.loads(raw) if raw else None


def _tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic, partition)


def test_add_routes_keeps_the_consumers_on_the_app() -> None:
    app = web.Application()
    consumers = _Consumers()
    add_routes(app, cast(Consumers, consumers))
    kept: object = app[CONSUMERS_KEY]
    assert kept is consumers


# Create and delete ------------------------------------------------------------------------


async def test_create_hands_every_setting_to_the_service_and_answers_the_instance_uri(
    api: _Api,
) -> None:
    status, body = await _call(
        api,
        "POST",
        "/consumers/payroll",
        {
            "name": "p1",
            "format": "JSON",
            "auto.offset.reset": "earliest",
            "auto.commit.enable": "true",
            "fetch.min.bytes": 1024,
            "consumer.request.timeout.ms": "2500",
            "callback_url": "http://127.0.0.1:9000/handoff",
            "callback_timeout_ms": 1500,
            "assignment_events": True,
            "record_headers": "all",
        },
    )
    sidecar = f"http://{api.client.host}:{api.client.port}"
    assert (status, body) == (
        200,
        {"instance_id": "p1", "base_uri": f"{sidecar}/consumers/payroll/instances/p1"},
    )
    assert api.consumers.created == [
        InstanceConfig(
            group="payroll",
            name="p1",
            format="json",
            auto_offset_reset="earliest",
            auto_commit=True,
            callback_url="http://127.0.0.1:9000/handoff",
            callback_timeout_s=1.5,
            poll_timeout_ms=2500,
            fetch_min_bytes=1024,
            assignment_events=True,
            record_headers="all",
        )
    ]


async def test_create_without_a_body_makes_a_named_binary_instance_with_the_defaults(
    api: _Api,
) -> None:
    async with api.client.post("/consumers/payroll", skip_auto_headers=NO_TYPE) as response:
        assert response.status == 200
        assert response.content_type == V2_RESPONSE_CONTENT_TYPE
        body = await response.json(content_type=None)
    (config,) = api.consumers.created
    assert re.fullmatch(r"instance-[0-9a-f]{12}", config.name), config.name
    assert body["instance_id"] == config.name
    assert body["base_uri"].endswith(f"/consumers/payroll/instances/{config.name}")
    assert config == InstanceConfig(group="payroll", name=config.name, format="binary")
    assert (config.auto_offset_reset, config.poll_timeout_ms, config.fetch_min_bytes) == (
        "latest",
        1000,
        1,
    )


async def test_two_instances_created_without_names_get_different_names(api: _Api) -> None:
    for _ in range(2):
        async with api.client.post("/consumers/payroll", skip_auto_headers=NO_TYPE) as r:
            assert r.status == 200
    first, second = api.consumers.created
    assert first.name != second.name


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        # -1 is REST Proxy's "disabled": the instance's default applies.
        ({"fetch.min.bytes": -1}, {"fetch_min_bytes": 1}),
        ({"fetch.min.bytes": 0}, {"fetch_min_bytes": 0}),
        ({"consumer.request.timeout.ms": 0}, {"poll_timeout_ms": 1000}),
        # The deprecated spellings land where their fields do.
        (
            {"id": "old", "requestWaitMs": 300, "responseMinBytes": 64},
            {"name": "old", "poll_timeout_ms": 300, "fetch_min_bytes": 64},
        ),
        (
            {"auto.commit.enable": False, "auto.offset.reset": "NONE"},
            {"auto_commit": False, "auto_offset_reset": "none"},
        ),
    ],
)
async def test_create_maps_rest_proxy_settings_onto_the_instance(
    api: _Api, settings: dict[str, Any], expected: dict[str, Any]
) -> None:
    status, body = await _call(api, "POST", "/consumers/payroll", settings)
    assert status == 200, body
    (config,) = api.consumers.created
    assert {name: getattr(config, name) for name in expected} == expected


async def test_the_instance_uri_names_the_host_the_client_asked(api: _Api) -> None:
    headers = V2 | {"Host": "sidecar.local:8082"}
    status, body = await _call(api, "POST", "/consumers/payroll", {"name": "p1"}, headers)
    assert (status, body["base_uri"]) == (
        200,
        "http://sidecar.local:8082/consumers/payroll/instances/p1",
    )


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        ({"format": "avro"}, V2, 422, 42204),
        ({"record_headers": "some"}, V2, 422, 42204),
        ({"nmae": "p1"}, V2, 400, 40001),
        ({"name": "a b"}, V2, 400, 40003),
        ({"callback_url": "http://10.0.0.8/handoff"}, V2, 400, 40001),
        ({"callback_timeout_ms": 100}, V2, 400, 40001),
        ({"fetch.min.bytes": 1.5}, V2, 400, 40001),
        ({"name": "p1"}, {"Content-Type": "text/plain"}, 415, 41501),
        ({"name": "p1"}, {"Content-Type": "application/octet-stream"}, 415, 41501),
    ],
)
async def test_a_creation_request_that_cannot_be_served_is_refused_before_the_service(
    api: _Api, body: object, headers: Mapping[str, str], status: int, code: int
) -> None:
    answer = await _call(api, "POST", "/consumers/payroll", body, headers)
    assert (answer[0], answer[1]["error_code"]) == (status, code), answer
    assert api.consumers.created == []


async def test_creating_an_instance_that_exists_is_the_services_409(api: _Api) -> None:
    status, body = await _call(api, "POST", "/consumers/billing", {"name": "b1"})
    assert (status, body) == (
        409,
        {"error_code": 40940, "message": "consumer instance b1 already exists"},
    )


async def test_delete_removes_the_instance_with_a_204(api: _Api) -> None:
    assert await _call(api, "DELETE", INSTANCE) == (204, None)
    assert api.consumers.deleted == [("billing", "b1")]
    status, body = await _call(api, "DELETE", INSTANCE)
    assert (status, body["error_code"]) == (404, 40403)


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("POST", "/subscription", {"topics": ["orders"]}),
        ("GET", "/subscription", None),
        ("DELETE", "/subscription", None),
        ("GET", "/assignments", None),
        ("GET", "/records", None),
        ("POST", "/offsets", None),
        ("POST", "/positions/end", {"partitions": []}),
        ("POST", "/events/ack", {"event_ids": [1]}),
    ],
)
async def test_every_instance_route_answers_404_40403_for_an_unknown_instance(
    api: _Api, method: str, suffix: str, body: object
) -> None:
    status, answer = await _call(api, method, f"/consumers/billing/instances/b9{suffix}", body)
    assert (status, answer["error_code"]) == (404, 40403)
    assert "b9" in answer["message"]
    assert api.instance.calls == []


# Subscription and assignment ------------------------------------------------------------


async def test_subscribing_to_topics_hands_them_over_in_order(api: _Api) -> None:
    status, _ = await _call(api, "POST", f"{INSTANCE}/subscription", {"topics": ["b", "a"]})
    assert status == 204
    assert api.instance.calls == [("subscribe", ("b", "a"), None)]


async def test_subscribing_to_a_pattern_hands_over_the_pattern_alone(api: _Api) -> None:
    body = {"topic_pattern": "ord.*"}
    assert await _call(api, "POST", f"{INSTANCE}/subscription", body) == (204, None)
    assert api.instance.calls == [("subscribe", None, "ord.*")]


@pytest.mark.parametrize(
    "body",
    [
        {"topics": ["orders"], "topic_pattern": "o.*"},
        {"topics": []},
        {"topics": ["orders", "orders"]},
        {"topic_pattern": "("},
    ],
)
async def test_a_bad_subscription_is_refused_with_40001_before_the_instance(
    api: _Api, body: object
) -> None:
    status, answer = await _call(api, "POST", f"{INSTANCE}/subscription", body)
    assert (status, answer["error_code"]) == (400, 40001)
    assert api.instance.calls == []


async def test_the_subscription_is_listed_as_a_v2_topics_object(api: _Api) -> None:
    api.instance.topics = ["orders", "payments"]
    async with api.client.get(f"{INSTANCE}/subscription") as response:
        assert response.status == 200
        assert response.content_type == V2_RESPONSE_CONTENT_TYPE
        assert await response.json(content_type=None) == {"topics": ["orders", "payments"]}


async def test_unsubscribing_is_a_204(api: _Api) -> None:
    assert await _call(api, "DELETE", f"{INSTANCE}/subscription") == (204, None)
    assert api.instance.calls == [("unsubscribe",)]


async def test_an_assignment_of_existing_partitions_is_checked_then_handed_over(
    api: _Api,
) -> None:
    body = {
        "partitions": [{"topic": "orders", "partition": 1}, {"topic": "payments", "partition": 0}]
    }
    assert await _call(api, "POST", f"{INSTANCE}/assignments", body) == (204, None)
    assert api.directory.checked == [[("orders", 1), ("payments", 0)]]
    assert api.instance.calls == [("assign_manually", [_tp("orders", 1), _tp("payments", 0)])]


@pytest.mark.parametrize(
    ("partition", "status", "code"),
    [
        ({"topic": "orders", "partition": 2}, 404, 40402),
        ({"topic": "gone", "partition": 0}, 404, 40401),
    ],
)
async def test_an_assignment_naming_a_partition_kafka_lacks_is_404_and_assigns_nothing(
    api: _Api, partition: dict[str, Any], status: int, code: int
) -> None:
    body = {"partitions": [{"topic": "orders", "partition": 0}, partition]}
    answer = await _call(api, "POST", f"{INSTANCE}/assignments", body)
    assert (answer[0], answer[1]["error_code"]) == (status, code)
    assert api.instance.calls == []


async def test_an_empty_assignment_assigns_none_without_asking_kafka(api: _Api) -> None:
    assert await _call(api, "POST", f"{INSTANCE}/assignments", {"partitions": []}) == (204, None)
    assert api.directory.checked == []
    assert api.instance.calls == [("assign_manually", [])]


async def test_the_assignment_is_listed_as_v2_partition_objects(api: _Api) -> None:
    api.instance.assigned = [_tp("orders", 1), _tp("payments", 0)]
    assert await _call(api, "GET", f"{INSTANCE}/assignments") == (
        200,
        {
            "partitions": [
                {"topic": "orders", "partition": 1},
                {"topic": "payments", "partition": 0},
            ]
        },
    )


# Records --------------------------------------------------------------------------------


async def test_records_come_after_rebalance_notices_and_hand_off_events(api: _Api) -> None:
    api.instance.config = dataclasses.replace(api.instance.config, assignment_events=True)
    api.instance.polled = PollResult(
        records=[Record("orders", 0, 41)],
        events=[HandoffEvent(7, HandoffKind.KEYS_ASSIGNED, "orders", 0, 1)],
        notices=[AssignmentNotice(AssignmentChange.PARTITIONS_ASSIGNED, (_tp("orders", 0),))],
    )
    async with api.client.get(f"{INSTANCE}/records") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/vnd.kafka.binary.v2+json"
        raw = await response.read()
        assert response.headers["Content-Length"] == str(len(raw))
    assert json.loads(raw) == [
        {"type": "partitions_assigned", "partitions": [{"topic": "orders", "partition": 0}]},
        {
            "type": "keys_assigned",
            "topic": "orders",
            "partition": 0,
            "generation": 1,
            "event_id": 7,
        },
        # b"k" and b"v", base64.
        {"topic": "orders", "key": "aw==", "value": "dg==", "partition": 0, "offset": 41},
    ]
    assert api.instance.deliveries == ["sent"]


async def test_an_empty_poll_is_an_empty_array(api: _Api) -> None:
    assert await _call(api, "GET", f"{INSTANCE}/records") == (200, [])
    assert api.instance.deliveries == ["sent"]


@pytest.mark.parametrize(
    ("query", "timeout_s", "max_bytes"),
    [
        # The instance's consumer.request.timeout.ms and the sidecar's max_poll_bytes.
        ("", 2.0, MAX_POLL_BYTES),
        ("?timeout=250&max_bytes=100", 0.25, 100),
        ("?timeout=0&max_bytes=-5", 2.0, MAX_POLL_BYTES),
        ("?timeout=60000&max_bytes=999999999", 2.0, MAX_POLL_BYTES),
        ("?cache=1&timeout=1500", 1.5, MAX_POLL_BYTES),
    ],
)
async def test_a_poll_waits_and_reads_no_more_than_the_query_and_its_caps_allow(
    api: _Api, query: str, timeout_s: float, max_bytes: int
) -> None:
    status, _ = await _call(api, "GET", f"{INSTANCE}/records{query}")
    assert status == 200
    assert api.instance.calls == [("delivery", timeout_s, max_bytes)]


@pytest.mark.parametrize(
    "query", ["?max_bytes=lots", "?timeout=1.5", "?timeout=%2B5", "?timeout=1&timeout=2"]
)
async def test_a_records_request_with_a_bad_query_is_refused_with_40001(
    api: _Api, query: str
) -> None:
    status, body = await _call(api, "GET", f"{INSTANCE}/records{query}")
    assert (status, body["error_code"]) == (400, 40001)
    assert api.instance.calls == []


async def test_a_records_request_accepting_another_format_is_406_before_polling(
    api: _Api,
) -> None:
    headers = {"Accept": "application/vnd.kafka.json.v2+json"}
    status, body = await _call(api, "GET", f"{INSTANCE}/records", headers=headers)
    assert (status, body["error_code"]) == (406, 40601)
    assert api.instance.calls == []


async def test_a_json_instance_embeds_json_values_under_its_own_content_type(api: _Api) -> None:
    api.instance.config = dataclasses.replace(api.instance.config, format="json")
    api.instance.polled = PollResult([Record("orders", 1, 5, key=None, value=b'{"n": 1}')], [])
    async with api.client.get(f"{INSTANCE}/records", headers={"Accept": "*/*"}) as response:
        assert response.headers["Content-Type"] == "application/vnd.kafka.json.v2+json"
        assert json.loads(await response.read()) == [
            {"topic": "orders", "key": None, "value": {"n": 1}, "partition": 1, "offset": 5}
        ]


async def test_records_that_cannot_be_encoded_are_put_back_not_lost(api: _Api) -> None:
    api.instance.config = dataclasses.replace(api.instance.config, format="json")
    api.instance.polled = PollResult([Record("orders", 1, 5, value=b"not json")], [])
    status, body = await _call(api, "GET", f"{INSTANCE}/records")
    assert (status, body["error_code"]) == (422, 42201)
    assert "orders-1 offset 5" in body["message"]
    assert api.instance.deliveries == ["put back"]


HEADERS = (("trace", b"t"), ("ordered.generation", b"1"))


@pytest.mark.parametrize(
    ("kept", "expected"),
    [
        ("app", [{"name": "trace", "value": "dA=="}]),
        (
            "all",
            [{"name": "trace", "value": "dA=="}, {"name": "ordered.generation", "value": "MQ=="}],
        ),
        ("none", None),
    ],
)
async def test_records_carry_the_headers_the_instance_keeps(
    api: _Api, kept: str, expected: list[dict[str, str]] | None
) -> None:
    api.instance.config = dataclasses.replace(api.instance.config, record_headers=kept)
    api.instance.polled = PollResult([Record("orders", 0, 3, headers=HEADERS)], [])
    status, body = await _call(api, "GET", f"{INSTANCE}/records")
    assert status == 200
    (record,) = body
    assert record.get("headers") == expected


async def test_records_are_put_back_when_the_client_left_while_the_poll_waited(
    api: _Api,
) -> None:
    api.instance.polled = PollResult([Record("orders", 0, 9)], [])
    api.instance.answer.clear()
    # Served as the sidecar serves (aiohttp's default): a handler whose client leaves runs
    # on; aiohttp's test server would cancel it instead.
    runner = web.AppRunner(_app(api.consumers, api.directory), handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        _, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1])
        writer.write(f"GET {INSTANCE}/records HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await asyncio.wait_for(api.instance.polling.wait(), 2)
        writer.close()
        await writer.wait_closed()
        # Let the server see the connection close before the poll answers.
        for _ in range(20):
            await asyncio.sleep(0.01)
        api.instance.answer.set()
        await asyncio.wait_for(api.instance.delivered.wait(), 2)
    finally:
        await runner.cleanup()
    assert api.instance.deliveries == ["put back"]


# Offsets and positions --------------------------------------------------------------------


async def test_a_commit_without_a_body_commits_everything_delivered(api: _Api) -> None:
    async with api.client.post(f"{INSTANCE}/offsets", skip_auto_headers=NO_TYPE) as response:
        assert response.status == 204
    assert api.instance.calls == [("commit", None)]


async def test_a_commit_stores_the_offset_after_each_processed_record(api: _Api) -> None:
    body = {
        "offsets": [
            {"topic": "orders", "partition": 1, "offset": 41},
            {"topic": "payments", "partition": 0, "offset": 0, "metadata": "m"},
        ]
    }
    assert await _call(api, "POST", f"{INSTANCE}/offsets", body) == (204, None)
    assert api.instance.calls == [("commit", {_tp("orders", 1): 42, _tp("payments", 0): 1})]


async def test_a_commit_of_an_empty_list_commits_nothing(api: _Api) -> None:
    assert await _call(api, "POST", f"{INSTANCE}/offsets", {"offsets": []}) == (204, None)
    assert api.instance.calls == [("commit", {})]


async def test_a_commit_sent_as_a_form_is_refused_with_415(api: _Api) -> None:
    # A web page can make a browser send this to localhost without a preflight.
    async with api.client.post(
        f"{INSTANCE}/offsets",
        data=b"offsets=1",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    ) as response:
        assert response.status == 415
        assert (await response.json(content_type=None))["error_code"] == 41501
    assert api.instance.calls == []


async def test_the_instance_refusing_a_call_is_answered_with_its_error(api: _Api) -> None:
    api.instance.fail = ConsumerStateConflict("not subscribed")
    assert await _call(api, "POST", f"{INSTANCE}/offsets") == (
        409,
        {"error_code": 40940, "message": "not subscribed"},
    )


async def test_committed_offsets_are_listed_as_kafka_stores_them(api: _Api) -> None:
    api.instance.stored = {_tp("orders", 0): 42}
    body = {
        "partitions": [{"topic": "orders", "partition": 0}, {"topic": "orders", "partition": 1}]
    }
    async with api.client.get(
        f"{INSTANCE}/offsets", data=json.dumps(body).encode(), headers=V2
    ) as response:
        assert response.status == 200
        assert response.content_type == V2_RESPONSE_CONTENT_TYPE
        answer = await response.json(content_type=None)
    # The partition without a committed offset is left out.
    assert answer == {
        "offsets": [{"topic": "orders", "partition": 0, "offset": 42, "metadata": ""}]
    }
    assert api.instance.calls == [("committed", [_tp("orders", 0), _tp("orders", 1)])]


async def test_committed_offsets_need_the_partitions_named(api: _Api) -> None:
    status, body = await _call(api, "GET", f"{INSTANCE}/offsets")
    assert (status, body["error_code"]) == (400, 40001)
    assert api.instance.calls == []


async def test_a_seek_moves_offsets_and_timestamps_once_every_partition_exists(
    api: _Api,
) -> None:
    body = {
        "offsets": [{"topic": "orders", "partition": 0, "offset": 10}],
        "timestamps": [
            {"topic": "orders", "partition": 1, "timestamp": "2024-01-01T01:00:00+01:00"}
        ],
    }
    assert await _call(api, "POST", f"{INSTANCE}/positions", body) == (204, None)
    assert api.directory.checked == [[("orders", 0), ("orders", 1)]]
    # 2024-01-01T00:00:00Z is 1_704_067_200 s after the epoch.
    assert api.instance.calls == [
        ("seek_positions", {_tp("orders", 0): 10}, {_tp("orders", 1): 1_704_067_200_000})
    ]


async def test_a_seek_naming_a_partition_kafka_lacks_moves_nothing(api: _Api) -> None:
    body = {
        "offsets": [
            {"topic": "orders", "partition": 0, "offset": 10},
            {"topic": "payments", "partition": 3, "offset": 0},
        ]
    }
    status, answer = await _call(api, "POST", f"{INSTANCE}/positions", body)
    assert (status, answer["error_code"]) == (404, 40402)
    assert api.instance.calls == []


@pytest.mark.parametrize(("end", "beginning"), [("beginning", True), ("end", False)])
async def test_a_seek_to_either_end_names_the_end_and_the_partitions(
    api: _Api, end: str, beginning: bool
) -> None:
    body = {
        "partitions": [{"topic": "payments", "partition": 0}, {"topic": "orders", "partition": 1}]
    }
    assert await _call(api, "POST", f"{INSTANCE}/positions/{end}", body) == (204, None)
    assert api.directory.checked == [[("payments", 0), ("orders", 1)]]
    assert api.instance.calls == [("seek_to", [_tp("payments", 0), _tp("orders", 1)], beginning)]


async def test_a_seek_to_the_end_of_a_missing_partition_is_404(api: _Api) -> None:
    body = {"partitions": [{"topic": "orders", "partition": 2}]}
    status, answer = await _call(api, "POST", f"{INSTANCE}/positions/end", body)
    assert (status, answer["error_code"]) == (404, 40402)
    assert api.instance.calls == []


# Key hand-off events ----------------------------------------------------------------------


async def test_acknowledged_event_ids_are_handed_over_in_order(api: _Api) -> None:
    body = {"event_ids": [9, 7]}
    assert await _call(api, "POST", f"{INSTANCE}/events/ack", body) == (204, None)
    assert api.instance.calls == [("acknowledge_events", (9, 7))]


@pytest.mark.parametrize("ids", [[7, 7], [-1], ["7"], None])
async def test_bad_event_ids_are_refused_with_40001_before_the_instance(
    api: _Api, ids: object
) -> None:
    status, body = await _call(api, "POST", f"{INSTANCE}/events/ack", {"event_ids": ids})
    assert (status, body["error_code"]) == (400, 40001)
    assert api.instance.calls == []
