"""Error mapping: every hierarchy class, aiohttp's own errors, and unexpected exceptions."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sidecar.core.errors import FencedGeneration, KafkaUnavailable, SidecarError, UnknownTopic
from sidecar.http.error_map import error_response, errors_middleware
from sidecar.http.produce_codec import V2_RESPONSE_CONTENT_TYPE

# Other loggers may write while a test runs (a client an earlier test left closing).
ERROR_MAP_LOGGER = "sidecar.http.error_map"
SECRET = "password=hunter2 at /srv/sidecar/internal.py"

Client = TestClient[web.Request, web.Application]


def hierarchy(root: type[SidecarError] = SidecarError) -> list[type[SidecarError]]:
    found = [root]
    for sub in root.__subclasses__():
        found.extend(hierarchy(sub))
    return found


def body_of(response: web.Response) -> object:
    assert response.text is not None
    return json.loads(response.text)


@pytest.mark.parametrize("error_class", hierarchy(), ids=lambda cls: cls.__name__)
def test_every_sidecar_error_maps_by_its_attributes(error_class: type[SidecarError]) -> None:
    response = error_response(error_class())
    assert response.status == error_class.http_status
    assert response.content_type == V2_RESPONSE_CONTENT_TYPE
    body = body_of(response)
    assert isinstance(body, dict)
    assert body["error_code"] == error_class.error_code
    assert body["message"] == error_class.default_message
    assert body.get("retriable", False) is error_class.retriable
    assert ("retriable" in body) is error_class.retriable


def test_error_message_is_the_raisers() -> None:
    response = error_response(UnknownTopic("topic 'orders' is not managed by this sidecar"))
    assert (response.status, body_of(response)) == (
        404,
        {"error_code": 40401, "message": "topic 'orders' is not managed by this sidecar"},
    )


def test_fenced_generation_carries_the_current_generation_and_count() -> None:
    response = error_response(FencedGeneration(current_generation=4, current_count=9))
    assert (response.status, body_of(response)) == (
        409,
        {
            "error_code": 40910,
            "message": FencedGeneration.default_message,
            "retriable": True,
            "current_generation": 4,
            "current_count": 9,
        },
    )


def test_fenced_generation_leaves_out_what_is_not_known() -> None:
    body = body_of(error_response(FencedGeneration("fenced")))
    assert isinstance(body, dict)
    assert "current_generation" not in body
    assert "current_count" not in body


def test_framework_codes_do_not_collide_with_hierarchy_codes() -> None:
    # status * 100 must stay free for aiohttp's own errors; only the root may use 50000.
    codes = {cls.error_code for cls in hierarchy() if cls is not SidecarError}
    assert not {status * 100 for status in range(400, 600)} & codes
    assert len(codes) == len(hierarchy()) - 1, "two hierarchy classes share an error_code"


def test_method_not_allowed_keeps_the_allow_header() -> None:
    response = error_response(web.HTTPMethodNotAllowed("DELETE", ["GET", "POST"]))
    assert response.status == 405
    assert sorted(response.headers["Allow"].split(",")) == ["GET", "POST"]
    assert response.content_type == V2_RESPONSE_CONTENT_TYPE
    assert body_of(response) == {"error_code": 40500, "message": "Method Not Allowed"}


@pytest.mark.parametrize(
    "exc",
    [RuntimeError(SECRET), KeyError(SECRET), web.HTTPFound("/elsewhere")],
    ids=["RuntimeError", "KeyError", "redirect"],
)
def test_anything_else_is_a_generic_500(exc: BaseException) -> None:
    response = error_response(exc)
    assert response.status == 500
    assert body_of(response) == {"error_code": 50000, "message": "internal error"}
    assert response.text is not None
    assert "hunter2" not in response.text


# Through a running application --------------------------------------------------------


async def fenced(request: web.Request) -> web.Response:
    raise FencedGeneration(current_generation=3, current_count=7)


async def unavailable(request: web.Request) -> web.Response:
    raise KafkaUnavailable("leader not available for orders-3")


async def broken(request: web.Request) -> web.Response:
    raise RuntimeError(SECRET)


async def gone(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.close()
    raise ConnectionResetError("the client closed the connection")


async def moved(request: web.Request) -> web.Response:
    raise web.HTTPFound("/fenced")


async def echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read())


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    app = web.Application(middlewares=[errors_middleware], client_max_size=64)
    app.router.add_get("/fenced", fenced)
    app.router.add_get("/unavailable", unavailable)
    app.router.add_get("/broken", broken)
    app.router.add_get("/moved", moved)
    app.router.add_get("/gone", gone)
    app.router.add_post("/echo", echo)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def answer(
    client: Client, method: str, path: str, data: bytes | None = None
) -> tuple[int, object]:
    async with client.request(method, path, data=data, allow_redirects=False) as response:
        if response.status < 400:
            return response.status, await response.text()
        assert response.content_type == V2_RESPONSE_CONTENT_TYPE
        return response.status, json.loads(await response.text())


async def test_sidecar_error_from_a_handler(client: Client) -> None:
    assert await answer(client, "GET", "/fenced") == (
        409,
        {
            "error_code": 40910,
            "message": FencedGeneration.default_message,
            "retriable": True,
            "current_generation": 3,
            "current_count": 7,
        },
    )


async def test_server_side_sidecar_error_is_logged_without_traceback(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=ERROR_MAP_LOGGER):
        status, body = await answer(client, "GET", "/unavailable")
    assert (status, body) == (
        503,
        {"error_code": 50002, "message": "leader not available for orders-3", "retriable": True},
    )
    assert [r.exc_info for r in caplog.records if r.name == ERROR_MAP_LOGGER] == [None]


async def test_unknown_route_is_404_with_generic_code(client: Client) -> None:
    assert await answer(client, "GET", "/nowhere") == (
        404,
        {"error_code": 40400, "message": "Not Found"},
    )


async def test_wrong_method_is_405_with_allow(client: Client) -> None:
    async with client.delete("/fenced") as response:
        assert response.status == 405
        assert "GET" in response.headers["Allow"]
        assert json.loads(await response.text()) == {
            "error_code": 40500,
            "message": "Method Not Allowed",
        }


async def test_body_over_the_server_limit_is_413(client: Client) -> None:
    status, body = await answer(client, "POST", "/echo", data=b"x" * 65)
    assert (status, body) == (413, {"error_code": 41300, "message": "Request Entity Too Large"})


async def test_unexpected_exception_is_500_without_internals(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger=ERROR_MAP_LOGGER):
        status, body = await answer(client, "GET", "/broken")
    assert (status, body) == (500, {"error_code": 50000, "message": "internal error"})
    assert "hunter2" not in json.dumps(body)
    # The operator, not the client, gets the traceback.
    (record,) = [r for r in caplog.records if r.name == ERROR_MAP_LOGGER]
    assert record.exc_info is not None
    assert record.exc_info[0] is RuntimeError


async def test_a_client_that_went_away_is_no_error_of_the_sidecars(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.DEBUG, logger=ERROR_MAP_LOGGER),
        pytest.raises(aiohttp.ClientConnectionError),
    ):
        await answer(client, "GET", "/gone")
    assert [(r.levelno, r.exc_info) for r in caplog.records if r.name == ERROR_MAP_LOGGER] == [
        (logging.DEBUG, None)
    ]


async def test_redirects_and_successes_pass_through(client: Client) -> None:
    async with client.get("/moved", allow_redirects=False) as response:
        assert response.status == 302
        assert response.headers["Location"] == "/fenced"
    assert await answer(client, "POST", "/echo", data=b"ok") == (200, "ok")
