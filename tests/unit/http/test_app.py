"""The data plane's application (``sidecar.http.app.build_app``) on stand-in services: the
v2 produce route (what it hands the produce service, its partition check, body limits,
idempotent retries, its metrics), the admin routes (what each hands the admin and change
services, what they refuse first) and the gate's order (token, then readiness)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from importlib.resources import files
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sidecar.config import HttpSettings, Settings
from sidecar.core.errors import (
    FencedGeneration,
    NoTruncationToConfirm,
    OperationInProgress,
    SidecarError,
    TopicAlreadyManaged,
    UnknownTopic,
)
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.procedures import Operation, OperationKind, Phase, SidecarId
from sidecar.core.produce import (
    EmbeddedFormat,
    OutgoingRecord,
    ProduceRequest,
    ProduceResult,
    RecordFailed,
    RecordWritten,
)
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.core.truncation import TruncatedBoundary
from sidecar.http.admin_codec import description_body, operation_body, topic_body
from sidecar.http.app import DATA_TOKEN_HEADER, build_app
from sidecar.http.produce_codec import V2_RESPONSE_CONTENT_TYPE
from sidecar.metrics import UNKNOWN_TOPIC, SidecarMetrics
from sidecar.service.admin import CreateTopic, LockHolding, TopicAdmin, TopicDescription
from sidecar.service.changes import ChangeRequest, ChangeRunner
from sidecar.service.compaction import Compaction, Compactor
from sidecar.service.produce import ProduceOutcome, ProduceService
from sidecar.service.registry import TopicRegistry
from sidecar.service.topic_ports import DirectoryKafka
from tests.unit.service.fakes import Registry, expanded_log

Client = TestClient[web.Request, web.Application]

ADMIN_TOKEN = "adm1n"
DATA_TOKEN = "d4ta"
MAX_BODY = 512
HTTP = HttpSettings(admin_enabled=True, admin_token=ADMIN_TOKEN, max_body_bytes=MAX_BODY)
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BINARY = {"Content-Type": "application/vnd.kafka.binary.v2+json"}
# b"k1" -> b"value"
RECORD = {"key": "azE=", "value": "dmFsdWU="}


class _Kafka:
    """The partition counts Kafka has, for the produce route's partition check."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = dict(counts)

    async def partition_count(self, name: str) -> int:
        if name not in self.counts:
            raise UnknownTopic(f"topic {name} does not exist")
        return self.counts[name]

    async def list_topics(self) -> list[str]:
        return sorted(self.counts)


class _Registry(Registry):
    """Managed "orders" (generation 1, partition 1 being retired) and unmanaged "plain"
    with three partitions in Kafka."""

    def __init__(self) -> None:
        state = TopicState(
            TopicConfig("orders", 1, 3),
            expanded_log(5),
            (PartitionMode.READ_WRITE, PartitionMode.READ_ONLY),
        )
        super().__init__(SimpleNamespace(name="orders", state=state))
        self.started = True
        self.kafka = _Kafka({"orders": 2, "plain": 3})

    def waiting_for(self) -> list[str]:
        return ["kafka", "producers"]


@dataclasses.dataclass
class _Produce:
    results: list[ProduceResult] = dataclasses.field(default_factory=lambda: [RecordWritten(1, 41)])
    calls: list[tuple[str, ProduceRequest, int | None]] = dataclasses.field(default_factory=list)
    error: BaseException | None = None

    async def produce(
        self, topic: str, request: ProduceRequest, partition: int | None = None
    ) -> ProduceOutcome:
        self.calls.append((topic, request, partition))
        if self.error is not None:
            raise self.error
        return ProduceOutcome(list(self.results), 1, 2)


def _state(name: str, count: int) -> TopicState:
    config = TopicConfig(name, count, 3)
    return TopicState(config, GenerationLog.start(count), (PartitionMode.READ_WRITE,) * count)


@dataclasses.dataclass
class _Admin:
    created: list[CreateTopic] = dataclasses.field(default_factory=list)
    adopted: list[tuple[str, bool, bool]] = dataclasses.field(default_factory=list)
    described: list[str] = dataclasses.field(default_factory=list)
    error: SidecarError | None = None

    async def create(self, request: CreateTopic) -> TopicState:
        self.created.append(request)
        if self.error is not None:
            raise self.error
        return _state(request.name, request.partitions)

    async def adopt(
        self, name: str, *, compacted: bool = False, ordered_delivery: bool = True
    ) -> TopicState:
        self.adopted.append((name, compacted, ordered_delivery))
        return _state(name, 4)

    async def describe(self, name: str) -> TopicDescription:
        self.described.append(name)
        return TopicDescription(_state(name, 2), LockHolding("sidecar-2", "change", 1.5))


LOST = TruncatedBoundary(generation=1, partition=0, offset=5, leader_epoch=2, log_end=3)


@dataclasses.dataclass
class _Changes:
    requests: list[ChangeRequest] = dataclasses.field(default_factory=list)
    confirmed: list[str] = dataclasses.field(default_factory=list)
    phase: Phase = Phase.DONE
    outcome: str = ""
    error: SidecarError | None = None

    async def change(self, request: ChangeRequest) -> Operation:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        return _operation(request, self.phase, self.outcome)

    async def confirm_truncation(self, topic: str) -> list[TruncatedBoundary]:
        self.confirmed.append(topic)
        if self.error is not None:
            raise self.error
        return [LOST]


@dataclasses.dataclass
class _Compactor:
    compacted: list[tuple[str, float | None]] = dataclasses.field(default_factory=list)
    error: SidecarError | None = None

    async def compact(self, topic: str, *, lock_timeout_s: float | None = None) -> Compaction:
        self.compacted.append((topic, lock_timeout_s))
        if self.error is not None:
            raise self.error
        return Compaction(folded=3, first_generation=3, current_generation=5)


def _operation(request: ChangeRequest, phase: Phase, outcome: str) -> Operation:
    return Operation(
        topic=request.topic,
        kind=request.kind or OperationKind.EXPAND,
        from_generation=0,
        from_count=1,
        target_count=request.target_count,
        phase=phase,
        coordinator=SidecarId("sidecar-1"),
        started_at=1_000.0,
        barrier_deadline=1_020.0,
        physical_count=request.target_count,
        outcome=outcome,
    )


@dataclasses.dataclass
class _Sidecar:
    registry: _Registry = dataclasses.field(default_factory=_Registry)
    produce: _Produce = dataclasses.field(default_factory=_Produce)
    admin: _Admin = dataclasses.field(default_factory=_Admin)
    changes: _Changes = dataclasses.field(default_factory=_Changes)
    compactor: _Compactor = dataclasses.field(default_factory=_Compactor)
    metrics: SidecarMetrics = dataclasses.field(default_factory=SidecarMetrics)

    def app(self, http: HttpSettings = HTTP) -> web.Application:
        return build_app(
            Settings(sidecar_id="app-test", http=http),
            cast(TopicRegistry, self.registry),
            cast(ProduceService, self.produce),
            cast(TopicAdmin, self.admin),
            cast(ChangeRunner, self.changes),
            cast(Compactor, self.compactor),
            self.metrics,
            cast(DirectoryKafka, self.registry.kafka),
        )

    def requests(self, topic: str, outcome: str) -> float | None:
        """sidecar_produce_requests_total of one topic label and outcome."""
        return self.metrics.registry.get_sample_value(
            "sidecar_produce_requests_total", {"topic": topic, "outcome": outcome}
        )

    def records(self, topic: str, outcome: str) -> float | None:
        return self.metrics.registry.get_sample_value(
            "sidecar_produce_records_total", {"topic": topic, "outcome": outcome}
        )


@pytest.fixture
def sidecar() -> _Sidecar:
    return _Sidecar()


@pytest.fixture
async def client(sidecar: _Sidecar) -> AsyncIterator[Client]:
    async with TestClient(TestServer(sidecar.app())) as test_client:
        yield test_client


async def _send(
    client: Client,
    method: str,
    path: str,
    body: object = None,
    headers: Mapping[str, str] = AUTH,
) -> tuple[int, Any]:
    """Status and JSON body of one request with ``body`` as JSON (bytes as they are)."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body)
    async with client.request(method, path, data=data, headers=dict(headers)) as response:
        return response.status, await response.json(content_type=None)


async def _produce(
    client: Client, path: str, body: object, headers: Mapping[str, str] = BINARY
) -> tuple[int, Any]:
    return await _send(client, "POST", path, body, headers)


# Produce --------------------------------------------------------------------------------


async def test_a_produce_is_decoded_and_handed_to_the_service_for_its_topic(
    client: Client, sidecar: _Sidecar
) -> None:
    headers = BINARY | {"Ordered-Expected-Count": "2"}
    body = {"records": [RECORD, {"value": None, "partition": 1}], "expected_generation": 1}
    sidecar.produce.results = [RecordWritten(1, 41), RecordFailed(42201, "no key")]
    async with client.post("/topics/orders", data=json.dumps(body), headers=headers) as response:
        assert response.status == 200
        assert response.content_type == V2_RESPONSE_CONTENT_TYPE
        answer = await response.json(content_type=None)
    assert sidecar.produce.calls == [
        (
            "orders",
            ProduceRequest(
                records=(
                    OutgoingRecord(b"k1", b"value", None, ()),
                    OutgoingRecord(None, None, 1, ()),
                ),
                expected_generation=1,
                expected_count=2,
                idempotency_key=None,
                format=EmbeddedFormat.BINARY,
            ),
            None,
        )
    ]
    assert answer == {
        "key_schema_id": None,
        "value_schema_id": None,
        "offsets": [
            {"partition": 1, "offset": 41, "error_code": None, "error": None},
            {"partition": None, "offset": None, "error_code": 42201, "error": "no key"},
        ],
        "generation": 1,
        "partition_count": 2,
    }


@pytest.mark.parametrize(("path", "partition"), [("orders", 0), ("plain", 2)])
async def test_a_partition_in_the_url_that_takes_records_is_handed_to_the_service(
    client: Client, sidecar: _Sidecar, path: str, partition: int
) -> None:
    status, _ = await _produce(
        client, f"/topics/{path}/partitions/{partition}", {"records": [RECORD]}
    )
    assert status == 200
    assert [(topic, p) for topic, _, p in sidecar.produce.calls] == [(path, partition)]


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/topics/orders/partitions/1", 409, 40902),  # read-only: being retired
        ("/topics/orders/partitions/2", 404, 40402),  # beyond the managed topic's own
        ("/topics/plain/partitions/3", 404, 40402),  # beyond Kafka's
        ("/topics/nosuch/partitions/0", 404, 40401),
        ("/topics/orders/partitions/one", 404, 40402),
        ("/topics/orders/partitions/-1", 404, 40402),
    ],
)
async def test_a_partition_in_the_url_that_cannot_take_records_fails_the_whole_request(
    client: Client, sidecar: _Sidecar, path: str, status: int, code: int
) -> None:
    answer = await _produce(client, path, {"records": [RECORD]})
    assert (answer[0], answer[1]["error_code"]) == (status, code), answer
    assert sidecar.produce.calls == []


@pytest.mark.parametrize(
    ("content_type", "body", "status", "code"),
    [
        ("text/plain", {"records": [RECORD]}, 415, 41501),
        # Names no embedded format: REST Proxy v2 refuses it for produce.
        (V2_RESPONSE_CONTENT_TYPE, {"records": [RECORD]}, 415, 41501),
        (BINARY["Content-Type"], {"records": []}, 400, 40001),
        (BINARY["Content-Type"], {"records": [RECORD], "expected_generaton": 1}, 400, 40001),
        (BINARY["Content-Type"], {"records": [{"key": "azE="}]}, 422, 42201),
        (BINARY["Content-Type"], b"{not json", 400, 40001),
    ],
)
async def test_a_produce_request_that_cannot_be_decoded_never_reaches_the_service(
    client: Client, sidecar: _Sidecar, content_type: str, body: object, status: int, code: int
) -> None:
    answer = await _produce(client, "/topics/orders", body, {"Content-Type": content_type})
    assert (answer[0], answer[1]["error_code"]) == (status, code), answer
    assert sidecar.produce.calls == []


async def test_a_body_over_the_configured_limit_is_refused_with_the_limit_named(
    client: Client, sidecar: _Sidecar
) -> None:
    status, body = await _produce(client, "/topics/orders", b" " * (MAX_BODY + 88))
    assert (status, body) == (
        413,
        {
            "error_code": 41301,
            "message": f"request body is 600 bytes; the limit is {MAX_BODY} bytes",
        },
    )
    assert sidecar.produce.calls == []


async def test_a_body_far_over_the_limit_is_refused_by_aiohttp_itself(client: Client) -> None:
    # aiohttp's own limit is the configured one plus 1024 bytes: past it, its 413.
    status, body = await _produce(client, "/topics/orders", b" " * (MAX_BODY + 1025))
    assert (status, body["error_code"]) == (413, 41300)


async def test_a_retry_with_the_same_idempotency_key_is_answered_without_a_second_write(
    client: Client, sidecar: _Sidecar
) -> None:
    headers = BINARY | {"Idempotency-Key": "retry-1"}
    first = await _produce(client, "/topics/orders", {"records": [RECORD]}, headers)
    sidecar.produce.results = [RecordWritten(0, 99)]  # a second write would answer this
    second = await _produce(client, "/topics/orders", {"records": [RECORD]}, headers)
    assert first == second
    assert first[1]["offsets"][0]["offset"] == 41
    assert len(sidecar.produce.calls) == 1
    assert sidecar.produce.calls[0][1].idempotency_key == "retry-1"


async def test_an_idempotency_key_sent_with_another_body_is_422(
    client: Client, sidecar: _Sidecar
) -> None:
    headers = BINARY | {"Idempotency-Key": "retry-1"}
    await _produce(client, "/topics/orders", {"records": [RECORD]}, headers)
    status, body = await _produce(client, "/topics/orders", {"records": [RECORD, RECORD]}, headers)
    assert (status, body["error_code"]) == (422, 42202)
    assert len(sidecar.produce.calls) == 1


async def test_an_idempotency_key_is_scoped_by_the_topic_and_the_partition_in_the_url(
    client: Client, sidecar: _Sidecar
) -> None:
    headers = BINARY | {"Idempotency-Key": "retry-1"}
    for path in ("/topics/orders", "/topics/orders/partitions/0", "/topics/plain"):
        status, _ = await _produce(client, path, {"records": [RECORD]}, headers)
        assert status == 200, path
    assert [(topic, p) for topic, _, p in sidecar.produce.calls] == [
        ("orders", None),
        ("orders", 0),
        ("plain", None),
    ]


async def test_a_fenced_produce_is_answered_with_the_current_generation_and_not_remembered(
    client: Client, sidecar: _Sidecar
) -> None:
    headers = BINARY | {"Idempotency-Key": "retry-1"}
    sidecar.produce.error = FencedGeneration("fenced", current_generation=3, current_count=4)
    assert await _produce(client, "/topics/orders", {"records": [RECORD]}, headers) == (
        409,
        {
            "error_code": 40910,
            "message": "fenced",
            "retriable": True,
            "current_generation": 3,
            "current_count": 4,
        },
    )
    # The client retries a fenced request; the retry must be written this time.
    sidecar.produce.error = None
    status, _ = await _produce(client, "/topics/orders", {"records": [RECORD]}, headers)
    assert status == 200
    assert len(sidecar.produce.calls) == 2


@pytest.mark.parametrize(
    ("results", "outcome", "written", "failed"),
    [
        ([RecordWritten(0, 1), RecordWritten(1, 2)], "ok", 2, 0),
        ([RecordWritten(0, 1), RecordFailed(42201, "x")], "partial", 1, 1),
        ([RecordFailed(42201, "x"), RecordFailed(42201, "y")], "failed", 0, 2),
    ],
)
async def test_a_served_produce_is_counted_by_outcome_and_records(
    client: Client,
    sidecar: _Sidecar,
    results: list[ProduceResult],
    outcome: str,
    written: int,
    failed: int,
) -> None:
    sidecar.produce.results = results
    # The second record: no key, b"x".
    body = {"records": [RECORD, {"value": "eA=="}]}
    status, _ = await _produce(client, "/topics/plain", body)
    assert status == 200
    assert sidecar.requests("plain", outcome) == 1
    assert sidecar.records("plain", "written") == written
    assert sidecar.records("plain", "failed") == failed


async def test_the_bytes_of_a_written_request_are_its_keys_and_values(
    client: Client, sidecar: _Sidecar
) -> None:
    sidecar.produce.results = [RecordWritten(0, 1), RecordWritten(1, 2)]
    status, _ = await _produce(client, "/topics/plain", {"records": [RECORD, {"value": "eA=="}]})
    assert status == 200
    bytes_total = sidecar.metrics.registry.get_sample_value(
        "sidecar_produce_bytes_total", {"topic": "plain"}
    )
    assert bytes_total == len(b"k1") + len(b"value") + len(b"x")


async def test_the_bytes_of_failed_records_are_not_counted(
    client: Client, sidecar: _Sidecar
) -> None:
    # sidecar_produce_bytes_total counts written records only: the first is refused.
    sidecar.produce.results = [RecordFailed(42201, "x"), RecordWritten(1, 2)]
    status, _ = await _produce(client, "/topics/plain", {"records": [RECORD, {"value": "eA=="}]})
    assert status == 200
    bytes_total = sidecar.metrics.registry.get_sample_value(
        "sidecar_produce_bytes_total", {"topic": "plain"}
    )
    assert bytes_total == len(b"x")


async def test_a_retry_answered_from_the_idempotency_cache_counts_no_records_again(
    client: Client, sidecar: _Sidecar
) -> None:
    headers = BINARY | {"Idempotency-Key": "retry-1"}
    for _ in range(2):
        status, _ = await _produce(client, "/topics/plain", {"records": [RECORD]}, headers)
        assert status == 200
    assert len(sidecar.produce.calls) == 1
    # Two requests answered, one record written once.
    assert sidecar.requests("plain", "ok") == 2
    assert sidecar.records("plain", "written") == 1
    bytes_total = sidecar.metrics.registry.get_sample_value(
        "sidecar_produce_bytes_total", {"topic": "plain"}
    )
    assert bytes_total == len(b"k1") + len(b"value")


async def test_a_produce_to_a_partition_that_is_not_a_number_is_counted(
    client: Client, sidecar: _Sidecar
) -> None:
    status, body = await _produce(client, "/topics/orders/partitions/x", {"records": [RECORD]})
    assert status == 404
    assert sidecar.requests("orders", str(body["error_code"])) == 1
    assert sidecar.produce.calls == []


async def test_a_refused_produce_for_an_unknown_topic_adds_no_series_of_its_name(
    client: Client, sidecar: _Sidecar
) -> None:
    status, _ = await _produce(
        client, "/topics/invented-1", {"records": [RECORD]}, {"Content-Type": "text/plain"}
    )
    assert status == 415
    assert sidecar.requests(UNKNOWN_TOPIC, "41501") == 1
    assert sidecar.requests("invented-1", "41501") is None


async def test_a_failed_produce_for_a_managed_topic_is_counted_under_its_name_and_code(
    client: Client, sidecar: _Sidecar
) -> None:
    sidecar.produce.error = FencedGeneration(current_generation=3, current_count=4)
    status, _ = await _produce(client, "/topics/orders", {"records": [RECORD]})
    assert status == 409
    assert sidecar.requests("orders", "40910") == 1


async def test_a_bug_in_the_service_is_a_500_counted_as_an_error(
    client: Client, sidecar: _Sidecar
) -> None:
    sidecar.produce.error = RuntimeError("hunter2")
    assert await _produce(client, "/topics/orders", {"records": [RECORD]}) == (
        500,
        {"error_code": 50000, "message": "internal error"},
    )
    assert sidecar.requests("orders", "error") == 1


# Admin ----------------------------------------------------------------------------------


async def test_create_hands_the_topic_to_the_admin_with_its_defaults(
    client: Client, sidecar: _Sidecar
) -> None:
    status, body = await _send(client, "POST", "/admin/topics", {"name": "events", "partitions": 3})
    assert sidecar.admin.created == [
        CreateTopic("events", 3, 3, compacted=False, ordered_delivery=True, configs={})
    ]
    assert (status, body) == (201, topic_body(_state("events", 3)))
    assert (body["config"]["name"], body["generation"], body["physical_count"]) == ("events", 0, 3)


async def test_create_hands_over_every_field_given(client: Client, sidecar: _Sidecar) -> None:
    document = {
        "name": "events",
        "partitions": 6,
        "replication_factor": 1,
        "compacted": True,
        "ordered_delivery": False,
        "configs": {"retention.ms": "1000"},
    }
    status, _ = await _send(client, "POST", "/admin/topics", document)
    assert status == 201
    assert sidecar.admin.created == [
        CreateTopic("events", 6, 1, True, False, {"retention.ms": "1000"})
    ]


@pytest.mark.parametrize(
    ("document", "code", "message"),
    [
        ({"name": "events"}, 40001, "missing field(s): partitions"),
        ({"name": "events", "partitions": 3, "count": 3}, 40001, "unknown field(s): count"),
        ({"name": "events", "partitions": "3"}, 40001, 'partitions must be an integer, got "3"'),
        ({"name": "events", "partitions": True}, 40001, "partitions must be an integer, got true"),
        ({"name": "events", "partitions": 3, "replication_factor": None}, 40001, "got null"),
        ({"name": "events", "partitions": 3, "configs": {"a": 1}}, 40001, "string values"),
        ({"name": "events", "partitions": 3, "configs": {"a": "\ud800"}}, 40001, "surrogate"),
        ({"name": "a b", "partitions": 3}, 40003, "is not a topic name"),
        ([{"name": "events"}], 40001, "must be a JSON object"),
    ],
)
async def test_a_create_request_the_admin_cannot_take_is_refused_first(
    client: Client, sidecar: _Sidecar, document: object, code: int, message: str
) -> None:
    status, body = await _send(client, "POST", "/admin/topics", document)
    assert (status, body["error_code"]) == (400, code)
    assert message in body["message"]
    assert sidecar.admin.created == []


async def test_the_admins_refusal_is_answered_with_its_error(
    client: Client, sidecar: _Sidecar
) -> None:
    sidecar.admin.error = TopicAlreadyManaged("events is managed already")
    status, body = await _send(client, "POST", "/admin/topics", {"name": "events", "partitions": 3})
    assert (status, body) == (409, {"error_code": 40901, "message": "events is managed already"})


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (None, ("legacy", False, True)),
        ({"compacted": True, "ordered_delivery": False}, ("legacy", True, False)),
    ],
)
async def test_adopt_hands_over_the_topic_in_the_path_and_its_options(
    client: Client, sidecar: _Sidecar, document: object, expected: tuple[str, bool, bool]
) -> None:
    status, body = await _send(client, "POST", "/admin/topics/legacy/adopt", document)
    assert (status, body) == (201, topic_body(_state("legacy", 4)))
    assert sidecar.admin.adopted == [expected]


async def test_adopt_refuses_what_it_does_not_take(client: Client, sidecar: _Sidecar) -> None:
    status, body = await _send(client, "POST", "/admin/topics/legacy/adopt", {"partitions": 3})
    assert (status, body["error_code"]) == (400, 40001)
    assert sidecar.admin.adopted == []


async def test_describe_answers_the_topic_and_its_lock(client: Client, sidecar: _Sidecar) -> None:
    status, body = await _send(client, "GET", "/admin/topics/orders")
    expected = TopicDescription(_state("orders", 2), LockHolding("sidecar-2", "change", 1.5))
    assert (status, body) == (200, description_body(expected))
    assert body["lock"] == {"holder": "sidecar-2", "purpose": "change", "age_s": 1.5}
    assert sidecar.admin.described == ["orders"]


async def test_confirming_truncation_answers_the_boundaries_confirmed(
    client: Client, sidecar: _Sidecar
) -> None:
    assert await _send(client, "POST", "/admin/topics/orders/confirm-truncation") == (
        200,
        {
            "topic": "orders",
            "confirmed": [
                {"generation": 1, "partition": 0, "boundary": 5, "leader_epoch": 2, "log_end": 3}
            ],
        },
    )
    assert sidecar.changes.confirmed == ["orders"]


async def test_confirming_truncation_takes_no_fields(client: Client, sidecar: _Sidecar) -> None:
    path = "/admin/topics/orders/confirm-truncation"
    status, body = await _send(client, "POST", path, {"force": True})
    assert (status, body["error_code"]) == (400, 40001)
    assert sidecar.changes.confirmed == []
    sidecar.changes.error = NoTruncationToConfirm()
    status, body = await _send(client, "POST", path, {})
    assert (status, body["error_code"]) == (409, 40951)


async def test_a_compaction_asked_for_runs_now_and_answers_what_it_folded(
    client: Client, sidecar: _Sidecar
) -> None:
    path = "/admin/topics/orders/compaction"
    assert await _send(client, "POST", path, {}) == (
        200,
        {"topic": "orders", "folded": 3, "first_generation": 3, "generation": 5},
    )
    # It waits for the lock as a change would, not as housekeeping's short try.
    assert sidecar.compactor.compacted == [("orders", 10.0)]
    status, body = await _send(client, "POST", path, {"now": True})
    assert (status, body["error_code"]) == (400, 40001)
    sidecar.compactor.error = OperationInProgress()
    status, body = await _send(client, "POST", path, {})
    assert (status, body["error_code"], body["retriable"]) == (409, 40920, True)


async def test_a_count_change_is_handed_over_and_answered_when_done(
    client: Client, sidecar: _Sidecar
) -> None:
    status, body = await _send(client, "POST", "/admin/topics/orders/partition-count", {"count": 4})
    (request,) = sidecar.changes.requests
    assert request == ChangeRequest("orders", 4, False, None, None)
    assert (status, body) == (
        200,
        operation_body(_operation(request, Phase.DONE, "")) | {"validate_only": False},
    )
    assert (body["phase"], body["target_count"]) == ("done", 4)


async def test_a_count_change_hands_over_its_options(client: Client, sidecar: _Sidecar) -> None:
    document = {"count": 2, "kind": "shrink", "validate_only": False, "delete_after_seconds": 30}
    status, _ = await _send(client, "POST", "/admin/topics/orders/partition-count", document)
    assert status == 200
    (request,) = sidecar.changes.requests
    assert request == ChangeRequest("orders", 2, False, 30.0, OperationKind.SHRINK)
    # A JSON integer is a number of seconds like any other.
    assert isinstance(request.delete_after_seconds, float)


async def test_a_rolled_back_change_is_a_retriable_409_with_its_reason(
    client: Client, sidecar: _Sidecar
) -> None:
    sidecar.changes.phase = Phase.ROLLED_BACK
    sidecar.changes.outcome = "barrier timed out"
    status, body = await _send(client, "POST", "/admin/topics/orders/partition-count", {"count": 4})
    assert (status, body) == (
        409,
        {
            "error_code": 40930,
            "message": "the change was rolled back: barrier timed out",
            "retriable": True,
        },
    )


async def test_a_validated_change_is_answered_with_its_plan_unfinished(
    client: Client, sidecar: _Sidecar
) -> None:
    # Only validated: nothing ran, so the plan has not reached DONE and that is no failure.
    sidecar.changes.phase = Phase.CREATING_PARTITIONS
    document = {"count": 4, "validate_only": True}
    status, body = await _send(client, "POST", "/admin/topics/orders/partition-count", document)
    assert (status, body["phase"], body["validate_only"]) == (200, "creating_partitions", True)
    assert sidecar.changes.requests[0].validate_only is True


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "missing field(s): count"),
        ({"count": 2.5}, "count must be an integer, got 2.5"),
        ({"count": True}, "count must be an integer, got true"),
        ({"count": 4, "kind": "grow"}, 'kind must be expand or shrink, got "grow"'),
        ({"count": 4, "delete_after_seconds": -1}, "delete_after_seconds must not be negative"),
        ({"count": 4, "delete_after_seconds": "60"}, "delete_after_seconds must be a number"),
        ({"count": 4, "validate_only": "yes"}, "validate_only must be true or false"),
        ({"count": 4, "target": 5}, "unknown field(s): target"),
    ],
)
async def test_a_count_change_the_runner_cannot_take_is_refused_first(
    client: Client, sidecar: _Sidecar, document: object, message: str
) -> None:
    status, body = await _send(client, "POST", "/admin/topics/orders/partition-count", document)
    assert (status, body["error_code"]) == (400, 40001)
    assert message in body["message"]
    assert sidecar.changes.requests == []


async def test_a_change_refused_by_the_runner_is_answered_with_its_error(
    client: Client, sidecar: _Sidecar
) -> None:
    sidecar.changes.error = OperationInProgress()
    status, body = await _send(client, "POST", "/admin/topics/orders/partition-count", {"count": 4})
    assert (status, body["error_code"], body["retriable"]) == (409, 40920, True)


ADMIN_CALLS = [
    ("POST", "/admin/topics", {"name": "events", "partitions": 3}),
    ("GET", "/admin/topics/orders", None),
    ("POST", "/admin/topics/orders/adopt", {}),
    ("POST", "/admin/topics/orders/partition-count", {"count": 4}),
    ("POST", "/admin/topics/orders/confirm-truncation", {}),
    ("POST", "/admin/topics/orders/compaction", {}),
]


def _untouched(sidecar: _Sidecar) -> bool:
    admin, changes = sidecar.admin, sidecar.changes
    return not (
        admin.created
        or admin.adopted
        or admin.described
        or changes.requests
        or changes.confirmed
        or sidecar.compactor.compacted
    )


@pytest.mark.parametrize(("method", "path", "document"), ADMIN_CALLS)
async def test_every_admin_route_needs_the_admin_token(
    client: Client, sidecar: _Sidecar, method: str, path: str, document: object
) -> None:
    headers = {"Authorization": "Bearer wrong"}
    async with client.request(method, path, json=document, headers=headers) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="ordered-sidecar admin"'
        assert (await response.json(content_type=None))["error_code"] == 40101
    assert _untouched(sidecar)


@pytest.mark.parametrize(("method", "path", "document"), ADMIN_CALLS)
async def test_every_admin_route_is_403_when_the_admin_api_is_off(
    sidecar: _Sidecar, method: str, path: str, document: object
) -> None:
    # The right token does not open an admin API that is off.
    off = HttpSettings(admin_enabled=False, admin_token=ADMIN_TOKEN)
    async with TestClient(TestServer(sidecar.app(off))) as client:
        assert (await _send(client, method, path, document))[1]["error_code"] == 40302
    assert _untouched(sidecar)


# The gate and the routes it serves ----------------------------------------------------------


async def test_the_openapi_document_is_served_while_the_sidecar_starts(sidecar: _Sidecar) -> None:
    sidecar.registry.started = False
    async with (
        TestClient(TestServer(sidecar.app())) as client,
        client.get("/openapi.json") as response,
    ):
        assert response.status == 200
        assert response.content_type == "application/json"
        served = await response.read()
    assert served == (files("sidecar.http") / "openapi.json").read_bytes()
    assert "/topics/{topic}" in json.loads(served)["paths"]


async def test_the_data_token_is_checked_before_readiness(sidecar: _Sidecar) -> None:
    sidecar.registry.started = False
    http = dataclasses.replace(HTTP, data_token=DATA_TOKEN)
    async with TestClient(TestServer(sidecar.app(http))) as client:
        # A caller without the token learns nothing, not even that the sidecar starts.
        status, body = await _produce(client, "/topics/orders", {"records": [RECORD]})
        assert (status, body["error_code"]) == (401, 40102)
        headers = BINARY | {DATA_TOKEN_HEADER: DATA_TOKEN}
        status, body = await _produce(client, "/topics/orders", {"records": [RECORD]}, headers)
        assert (status, body["error_code"]) == (503, 50360)
        assert body["message"] == "the sidecar is starting; waiting for: kafka, producers"
        async with client.get("/openapi.json") as response:
            assert response.status == 401
    assert sidecar.produce.calls == []


async def test_a_data_token_of_other_bytes_than_utf8_is_a_401(sidecar: _Sidecar) -> None:
    http = dataclasses.replace(HTTP, data_token=DATA_TOKEN)
    async with TestClient(TestServer(sidecar.app(http))) as client:
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(
            b"GET /topics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + DATA_TOKEN_HEADER.encode()
            + b": "
            + DATA_TOKEN.encode()
            + b"\xff\r\n\r\n"
        )
        response = await reader.read()
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"401"
    assert json.loads(body)["error_code"] == 40102


async def test_the_discovery_routes_read_kafka_through_the_directory(client: Client) -> None:
    async with client.get("/topics") as response:
        assert response.status == 200
        assert await response.json(content_type=None) == ["orders", "plain"]
