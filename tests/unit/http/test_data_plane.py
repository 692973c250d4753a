"""The data plane's gate (``sidecar.http.app.data_plane_middleware``) and the operations
listener (``sidecar.http.ops``): readiness, the data token, and which paths each serves."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sidecar.config import HttpSettings, Settings
from sidecar.core.errors import NotReady
from sidecar.core.participant import SessionState
from sidecar.http.app import DATA_TOKEN_HEADER, build_app
from sidecar.http.ops import build_ops_app
from sidecar.metrics import SidecarMetrics
from sidecar.service.admin import TopicAdmin
from sidecar.service.changes import ChangeRunner
from sidecar.service.compaction import Compactor
from sidecar.service.produce import ProduceService
from sidecar.service.registry import TopicRegistry
from sidecar.service.topic_ports import DirectoryKafka

Client = TestClient[web.Request, web.Application]
TOKEN = "data-s3cret"


@dataclasses.dataclass
class _Registry:
    """What the HTTP layer reads of the registry while the sidecar starts."""

    started: bool = False
    ready: bool = False
    waiting: tuple[str, ...] = ("kafka", "zookeeper", "producers")
    zookeeper_state: SessionState = SessionState.LOST
    topics: dict[str, Any] = dataclasses.field(default_factory=dict)

    def waiting_for(self) -> list[str]:
        return list(self.waiting)


def _data_app(registry: _Registry, data_token: str = "") -> web.Application:
    settings = Settings(sidecar_id="gate-test", http=HttpSettings(data_token=data_token))
    return build_app(
        settings,
        cast(TopicRegistry, registry),
        cast(ProduceService, object()),
        cast(TopicAdmin, object()),
        cast(ChangeRunner, object()),
        cast(Compactor, object()),
        SidecarMetrics(),
        cast(DirectoryKafka, object()),
    )


@pytest.fixture
async def starting() -> AsyncIterator[tuple[_Registry, Client]]:
    registry = _Registry()
    async with TestClient(TestServer(_data_app(registry))) as client:
        yield registry, client


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/topics/orders"),
        ("POST", "/topics/orders/partitions/0"),
        ("POST", "/v3/clusters/c/topics/orders/records"),
        ("POST", "/consumers/group"),
        ("GET", "/topics"),
        ("POST", "/admin/topics"),
    ],
)
async def test_data_routes_answer_a_retriable_503_until_started(
    starting: tuple[_Registry, Client], method: str, path: str
) -> None:
    _, client = starting
    async with client.request(method, path, json={"records": []}) as response:
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        body = await response.json(content_type=None)
    assert body["error_code"] == NotReady.error_code
    assert body["retriable"] is True
    assert "kafka, zookeeper, producers" in body["message"]


async def test_readyz_names_what_is_still_waited_for(
    starting: tuple[_Registry, Client],
) -> None:
    registry, client = starting
    async with client.get("/healthz") as health:
        assert health.status == 200
    async with client.get("/readyz") as response:
        assert response.status == 503
        body = await response.json()
    assert body == {
        "ready": False,
        "waiting_for": ["kafka", "zookeeper", "producers"],
        "zookeeper": "lost",
    }
    registry.started = registry.ready = True
    registry.zookeeper_state = SessionState.CONNECTED
    async with client.get("/readyz") as response:
        assert (response.status, await response.json()) == (
            200,
            {"ready": True, "waiting_for": [], "zookeeper": "connected"},
        )


async def test_once_started_the_gate_lets_data_routes_through() -> None:
    registry = _Registry(started=True, ready=True)
    # Past the gate: the admin API's own answer (disabled), not 503.
    async with (
        TestClient(TestServer(_data_app(registry))) as client,
        client.get("/admin/topics/t") as response,
    ):
        assert response.status == 403


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({DATA_TOKEN_HEADER: "wrong"}, 401),
        ({DATA_TOKEN_HEADER: TOKEN[:-1]}, 401),
        ({DATA_TOKEN_HEADER: TOKEN}, 403),  # past the token: the admin API is off
    ],
)
async def test_the_data_token_guards_every_data_route(headers: dict[str, str], status: int) -> None:
    registry = _Registry(started=True, ready=True)
    async with (
        TestClient(TestServer(_data_app(registry, TOKEN))) as client,
        client.get("/admin/topics/t", headers=headers) as response,
    ):
        assert response.status == status
        if status == 401:
            assert (await response.json(content_type=None))["error_code"] == 40102


async def test_probes_need_no_data_token() -> None:
    registry = _Registry(started=True, ready=True, zookeeper_state=SessionState.CONNECTED)
    async with TestClient(TestServer(_data_app(registry, TOKEN))) as client:
        for path in ("/healthz", "/readyz", "/metrics"):
            async with client.get(path) as response:
                assert response.status == 200, path


async def test_the_operations_listener_serves_probes_and_metrics_only() -> None:
    registry = _Registry(started=True, ready=True, zookeeper_state=SessionState.CONNECTED)
    app = build_ops_app(cast(TopicRegistry, registry), SidecarMetrics())
    async with TestClient(TestServer(app)) as client:
        for path in ("/healthz", "/readyz", "/metrics"):
            async with client.get(path) as response:
                assert response.status == 200, path
        for method, path in (
            ("POST", "/topics/orders"),
            ("GET", "/topics"),
            ("POST", "/v3/clusters/c/topics/orders/records"),
            ("POST", "/consumers/group"),
            ("GET", "/admin/topics/t"),
            ("GET", "/openapi.json"),
        ):
            async with client.request(method, path) as response:
                assert response.status == 404, path
                body = await response.json(content_type=None)
                assert body["error_code"] == 40400
