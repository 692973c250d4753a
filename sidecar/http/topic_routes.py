"""REST Proxy v2's read-only topic and broker routes, with the ordered extensions.

=======================================  ====================================================
route                                    answer (REST Proxy v2 shape)
=======================================  ====================================================
``GET /topics``                          ``["orders", ...]`` (internal topics left out)
``GET /topics/{topic}``                  ``{"name", "configs", "partitions": [...]}``
``GET /topics/{topic}/partitions``       ``[{"partition", "leader", "replicas": [...]}, ...]``
``GET /topics/{topic}/partitions/{p}``   ``{"partition", "leader", "replicas": [...]}``
``GET /brokers``                         ``{"brokers": [1, 2, 3]}``
=======================================  ====================================================

Each replica is ``{"broker", "leader", "in_sync"}``. Extensions: a topic says whether it
is ``managed``, and a managed one its ``generation`` and ``undeleted_count``; every
partition of a managed topic has a ``mode`` (``read_write``, ``read_only``, ``removed``,
or null for a partition Kafka has beyond the managed topic's own). Unmanaged topics
have no ``mode``, so their answers are exactly REST Proxy's.
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from sidecar.core.topics import TopicState
from sidecar.http.edge import partition_in_path
from sidecar.http.produce_codec import V2_RESPONSE_CONTENT_TYPE
from sidecar.service.topics import PartitionView, TopicDirectory

TOPICS_KEY: Final = web.AppKey("topics", TopicDirectory)


def add_routes(app: web.Application, directory: TopicDirectory) -> None:
    app[TOPICS_KEY] = directory
    app.router.add_get("/topics", list_topics)
    app.router.add_get("/topics/{topic}", get_topic)
    app.router.add_get("/topics/{topic}/partitions", list_partitions)
    app.router.add_get("/topics/{topic}/partitions/{partition}", get_partition)
    app.router.add_get("/brokers", list_brokers)


def _json(body: object) -> web.Response:
    return web.json_response(body, content_type=V2_RESPONSE_CONTENT_TYPE)


async def list_topics(request: web.Request) -> web.Response:
    return _json(await request.app[TOPICS_KEY].names())


async def get_topic(request: web.Request) -> web.Response:
    view = await request.app[TOPICS_KEY].topic(request.match_info["topic"])
    body: dict[str, Any] = {
        "name": view.name,
        "configs": dict(view.configs),
        "partitions": [partition_body(p, view.managed) for p in view.partitions],
        "managed": view.managed is not None,
    }
    if view.managed is not None:
        body["generation"] = view.managed.current.number
        body["undeleted_count"] = view.managed.current.undeleted_count
    return _json(body)


async def list_partitions(request: web.Request) -> web.Response:
    state, views = await request.app[TOPICS_KEY].partitions(request.match_info["topic"])
    return _json([partition_body(view, state) for view in views])


async def get_partition(request: web.Request) -> web.Response:
    partition = partition_in_path(request)
    assert partition is not None  # the route has the parameter
    state, view = await request.app[TOPICS_KEY].partition(request.match_info["topic"], partition)
    return _json(partition_body(view, state))


async def list_brokers(request: web.Request) -> web.Response:
    return _json({"brokers": await request.app[TOPICS_KEY].brokers()})


def partition_body(view: PartitionView, managed: TopicState | None) -> dict[str, Any]:
    """A partition in REST Proxy v2's shape; ``mode`` only when the topic is managed."""
    info = view.info
    body: dict[str, Any] = {
        "partition": info.partition,
        "leader": info.leader,
        "replicas": [
            {"broker": broker, "leader": broker == info.leader, "in_sync": broker in info.in_sync}
            for broker in info.replicas
        ],
    }
    if managed is not None:
        body["mode"] = None if view.mode is None else view.mode.value
    return body
