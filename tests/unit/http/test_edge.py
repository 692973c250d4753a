"""Names in the path are refused before any handler runs, on every route that has them.

The application is the real one (``build_app`` and the consumer routes) on stand-ins
for the services that fail the request if anything touches them: a refused name must
be answered 400 without reaching Kafka, ZooKeeper or a metric.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from importlib.resources import files
from typing import Any, NoReturn, cast
from urllib.parse import quote

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sidecar.config import Settings
from sidecar.http.app import build_app
from sidecar.http.consumer_routes import add_routes as add_consumer_routes
from sidecar.metrics import SidecarMetrics
from sidecar.service.admin import TopicAdmin
from sidecar.service.changes import ChangeRunner
from sidecar.service.compaction import Compactor
from sidecar.service.consumers import Consumers
from sidecar.service.produce import ProduceService
from sidecar.service.registry import TopicRegistry
from sidecar.service.topic_ports import DirectoryKafka

Client = TestClient[web.Request, web.Application]

# ".." alone is not here: clients resolve it as a path step before sending.
BAD_NAMES = ["../../etc", "€", "a" * 300, "a\x00b", "a\r\nb", "a b", "a:b"]
GOOD = {"topic": "orders", "group": "billing", "name": "b1", "partition": "0"}


class _Untouchable:
    def __getattr__(self, name: str) -> NoReturn:
        raise AssertionError(f"a refused name reached the service ({name})")


class _StartedRegistry(_Untouchable):
    """Started, so the data plane's gate lets requests on to the name checks; nothing
    else of it may be read."""

    started = True


def _documented_operations() -> list[tuple[str, str]]:
    text = (files("sidecar.http") / "openapi.json").read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return [
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in {"get", "post", "delete"} and re.search(r"\{(topic|group|name)\}", path)
    ]


OPERATIONS = _documented_operations()


def _path(template: str, values: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        return quote(values[match.group(1)], safe="")

    return re.sub(r"\{(\w+)\}", value, template)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    metrics = SidecarMetrics()
    settings = Settings(sidecar_id="edge-test")
    app = build_app(
        settings,
        cast(TopicRegistry, _StartedRegistry()),
        cast(ProduceService, _Untouchable()),
        cast(TopicAdmin, _Untouchable()),
        cast(ChangeRunner, _Untouchable()),
        cast(Compactor, _Untouchable()),
        metrics,
        cast(DirectoryKafka, _Untouchable()),
    )
    add_consumer_routes(app, cast(Consumers, _Untouchable()))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


def test_every_route_with_a_name_is_covered() -> None:
    assert len(OPERATIONS) >= 20


@pytest.mark.parametrize(("method", "template"), OPERATIONS)
async def test_a_bad_name_in_the_path_is_refused_before_the_handler(
    client: Client, method: str, template: str
) -> None:
    for parameter in re.findall(r"\{(topic|group|name)\}", template):
        for bad in BAD_NAMES:
            path = _path(template, GOOD | {parameter: bad})
            async with client.request(
                method,
                path,
                data=b"{}",
                headers={
                    "Content-Type": "application/vnd.kafka.v2+json",
                    "Authorization": "Bearer x",
                },
            ) as response:
                body = await response.json(content_type=None)
            assert (response.status, body["error_code"]) == (400, 40003), (path, body)
            assert f"{parameter} in the path" in body["message"]


@pytest.mark.parametrize("bad", BAD_NAMES)
async def test_a_bad_topic_name_in_a_v3_path_is_refused_before_anything(
    client: Client, bad: str
) -> None:
    # topic_name, not topic: checked by the v3 handler first, answered in v3's shape.
    path = f"/v3/clusters/any/topics/{quote(bad, safe='')}/records"
    async with client.post(path, data=b"{}", headers={"Content-Type": "application/json"}) as r:
        body = await r.json(content_type=None)
    assert (r.status, body["error_code"], body["v2_error_code"]) == (400, 400, 40003), body
    assert "topic_name in the path" in body["message"]
