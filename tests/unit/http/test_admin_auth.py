"""The admin API's bearer token: scheme without case, any header bytes a 401 at worst."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sidecar.config import HttpSettings, Settings
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.http.admin_codec import description_body
from sidecar.http.app import build_app
from sidecar.metrics import SidecarMetrics
from sidecar.service.admin import TopicAdmin, TopicDescription
from sidecar.service.changes import ChangeRunner
from sidecar.service.compaction import Compactor
from sidecar.service.produce import ProduceService
from sidecar.service.registry import TopicRegistry
from sidecar.service.topic_ports import DirectoryKafka

TOKEN = "s3cret-tøken"
Client = TestClient[web.Request, web.Application]


def _described(name: str) -> TopicDescription:
    config = TopicConfig(name, 1, 3)
    return TopicDescription(
        TopicState(config, GenerationLog.start(1), (PartitionMode.READ_WRITE,)), None
    )


class _Started:
    """A registry that has finished starting (the data plane's gate lets requests in)."""

    started = True


class _Admin:
    async def describe(self, name: str) -> TopicDescription:
        return _described(name)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    settings = Settings(
        sidecar_id="auth-test", http=HttpSettings(admin_enabled=True, admin_token=TOKEN)
    )
    app = build_app(
        settings,
        cast(TopicRegistry, _Started()),
        cast(ProduceService, object()),
        cast(TopicAdmin, _Admin()),
        cast(ChangeRunner, object()),
        cast(Compactor, object()),
        SidecarMetrics(),
        cast(DirectoryKafka, object()),
    )
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def _raw(client: Client, authorization: bytes) -> tuple[int, dict[str, Any], bytes]:
    """GET /admin/topics/t with exactly these Authorization header bytes."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(
        b"GET /admin/topics/t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: " + authorization + b"\r\n\r\n"
    )
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body), head


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"  Bearer   {TOKEN} "],
)
async def test_the_token_is_accepted_with_the_scheme_in_any_case(
    client: Client, authorization: str
) -> None:
    status, body, _ = await _raw(client, authorization.encode())
    assert (status, body) == (200, description_body(_described("t")))


@pytest.mark.parametrize(
    "authorization",
    [
        b"Bearer \xff\xfe",
        b"Bearer s3cret-t\xf8ken",  # the token's latin-1 bytes, not its UTF-8
        b"\xff",
        b"Basic " + TOKEN.encode(),
        b"Bearer",
        b"Bearer " + TOKEN.encode() + b"x",
        b"",
    ],
)
async def test_anything_else_is_a_401_never_a_500(client: Client, authorization: bytes) -> None:
    status, body, head = await _raw(client, authorization)
    assert (status, body["error_code"]) == (401, 40101)
    assert b'WWW-Authenticate: Bearer realm="ordered-sidecar admin"' in head
