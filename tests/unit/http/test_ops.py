"""The operations listener (``sidecar.http.ops``): ``/healthz``, ``/readyz`` and ``/metrics``
on a stand-in registry, as ``build_ops_app`` serves them and as ``add_ops_routes`` adds
them to another application."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from sidecar.core.participant import SessionState
from sidecar.http.ops import OPS_PATHS, add_ops_routes, build_ops_app
from sidecar.http.produce_codec import V2_RESPONSE_CONTENT_TYPE
from sidecar.metrics import SidecarMetrics
from sidecar.service.registry import TopicRegistry

Client = TestClient[web.Request, web.Application]


@dataclasses.dataclass
class _Registry:
    """What the probes read of the registry."""

    ready: bool = False
    waiting: tuple[str, ...] = ("kafka", "zookeeper")
    zookeeper_state: SessionState = SessionState.LOST

    def waiting_for(self) -> list[str]:
        return list(self.waiting)


@dataclasses.dataclass
class _Ops:
    registry: _Registry
    metrics: SidecarMetrics
    client: Client


@pytest.fixture
async def ops() -> AsyncIterator[_Ops]:
    registry = _Registry()
    metrics = SidecarMetrics()
    app = build_ops_app(cast(TopicRegistry, registry), metrics)
    async with TestClient(TestServer(app)) as client:
        yield _Ops(registry, metrics, client)


def _sample(text: str, name: str, labels: dict[str, str]) -> float | None:
    """The value of one sample of a Prometheus text exposition, None if it is absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


async def test_healthz_answers_ok_while_nothing_the_sidecar_needs_is_there(ops: _Ops) -> None:
    # Liveness must not depend on Kafka or ZooKeeper: a restart would not bring them back.
    assert not ops.registry.ready
    async with ops.client.get("/healthz") as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        assert await response.json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("state", "waiting"),
    [
        (SessionState.LOST, ("kafka", "zookeeper", "producers")),
        (SessionState.SUSPENDED, ("zookeeper",)),
        (SessionState.CONNECTED, ("producers",)),
    ],
)
async def test_readyz_is_503_naming_what_is_waited_for_and_the_session_state(
    ops: _Ops, state: SessionState, waiting: tuple[str, ...]
) -> None:
    ops.registry.zookeeper_state = state
    ops.registry.waiting = waiting
    async with ops.client.get("/readyz") as response:
        assert response.status == 503
        body = await response.json()
    assert body == {"ready": False, "waiting_for": list(waiting), "zookeeper": state.value}


async def test_readyz_once_ready_is_200_and_waits_for_nothing(ops: _Ops) -> None:
    ops.registry.ready = True
    ops.registry.zookeeper_state = SessionState.CONNECTED
    # Whatever the registry still lists, a ready sidecar is not waiting for it.
    ops.registry.waiting = ("producers",)
    async with ops.client.get("/readyz") as response:
        assert response.status == 200
        assert await response.json() == {
            "ready": True,
            "waiting_for": [],
            "zookeeper": "connected",
        }


async def test_readyz_follows_the_registry_from_one_request_to_the_next(ops: _Ops) -> None:
    statuses = []
    for ready in (False, True, False):
        ops.registry.ready = ready
        async with ops.client.get("/readyz") as response:
            statuses.append((response.status, (await response.json())["ready"]))
    assert statuses == [(503, False), (200, True), (503, False)]


async def test_metrics_are_the_given_metrics_in_prometheus_text_format(ops: _Ops) -> None:
    ops.metrics.produce_requests.labels("orders", "ok").inc(3)
    # Another sidecar's metrics in the same process have a registry of their own.
    SidecarMetrics().produce_requests.labels("orders", "ok").inc(5)
    async with ops.client.get("/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
        text = await response.text()
    labels = {"topic": "orders", "outcome": "ok"}
    assert _sample(text, "sidecar_produce_requests_total", labels) == 3.0


async def test_metrics_are_read_at_each_scrape(ops: _Ops) -> None:
    labels = {"topic": "orders", "outcome": "ok"}
    async with ops.client.get("/metrics") as response:
        before = await response.text()
    ops.metrics.produce_requests.labels("orders", "ok").inc(2)
    async with ops.client.get("/metrics") as response:
        after = await response.text()
    assert _sample(before, "sidecar_produce_requests_total", labels) is None
    assert _sample(after, "sidecar_produce_requests_total", labels) == 2.0


async def test_a_probe_asked_with_another_method_is_a_405_in_the_error_shape(ops: _Ops) -> None:
    async with ops.client.post("/healthz") as response:
        assert response.status == 405
        assert "GET" in response.headers["Allow"]
        assert response.content_type == V2_RESPONSE_CONTENT_TYPE
        assert await response.json(content_type=None) == {
            "error_code": 40500,
            "message": "Method Not Allowed",
        }


async def test_add_ops_routes_adds_exactly_the_ops_paths_beside_an_apps_own_routes() -> None:
    async def own(request: web.Request) -> web.Response:
        return web.Response(text="own")

    registry = _Registry(ready=True, zookeeper_state=SessionState.CONNECTED)
    app = web.Application()
    app.router.add_get("/own", own)
    add_ops_routes(app, cast(TopicRegistry, registry), SidecarMetrics())
    served = {
        route.resource.canonical
        for route in app.router.routes()
        if route.method == "GET" and route.resource is not None
    }
    assert served == OPS_PATHS | {"/own"}
    async with TestClient(TestServer(app)) as client:
        for path in sorted(OPS_PATHS):
            async with client.get(path) as response:
                assert response.status == 200, path
        async with client.get("/own") as response:
            assert await response.text() == "own"
