"""The sidecar's HTTP surface (aiohttp), bound to 127.0.0.1 by default.

Routes (the OpenAPI document at ``/openapi.json`` has the details):

* ``POST /topics/{topic}``, ``POST /topics/{topic}/partitions/{partition}``: produce,
  Confluent REST Proxy v2 compatible.
* ``POST /v3/clusters/{cluster_id}/topics/{topic_name}/records``: produce, Confluent
  REST Proxy v3 compatible, one record or a stream of them; ``GET /v3/clusters``,
  ``GET /v3/clusters/{cluster_id}`` (``v3_records``).
* ``GET /topics``, ``GET /topics/{topic}``, ``.../partitions``, ``.../partitions/{p}``,
  ``GET /brokers``: REST Proxy v2 discovery, with the ordered extensions
  (``topic_routes``).
* ``GET /healthz`` (the process answers), ``GET /readyz`` (Kafka started and the
  ZooKeeper session connected), ``GET /metrics`` (Prometheus).
* ``/admin/...``: create, adopt, describe, change the partition count, compact the
  generation log. Off unless
  ``http.admin_enabled``; every call needs ``Authorization: Bearer <http.admin_token>``.

Handlers only translate: decode the request, call the service, encode the answer.
Errors become responses in one place, ``errors_middleware``.
"""

from __future__ import annotations

import hmac
import json
import time
from pathlib import Path
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from sidecar.config import Settings
from sidecar.core import names
from sidecar.core.errors import (
    AdminDisabled,
    BadRequest,
    ChangeRolledBack,
    DataTokenMissing,
    NotAuthenticated,
    NotReady,
    SidecarError,
)
from sidecar.core.procedures import OperationKind, Phase
from sidecar.http.admin_codec import (
    description_body,
    operation_body,
    topic_body,
    truncations_body,
)
from sidecar.http.connections import connection_middleware
from sidecar.http.edge import partition_in_path, path_names_middleware
from sidecar.http.error_map import errors_middleware
from sidecar.http.json_body import field, is_utf8, json_object
from sidecar.http.ops import OPS_PATHS, add_ops_routes
from sidecar.http.produce_codec import (
    V2_RESPONSE_CONTENT_TYPE,
    decode_produce_request,
    encode_produce_response,
)
from sidecar.http.topic_routes import TOPICS_KEY
from sidecar.http.topic_routes import add_routes as add_topic_routes
from sidecar.http.v3_records import add_routes as add_v3_routes
from sidecar.metrics import SidecarMetrics
from sidecar.service.admin import CreateTopic, TopicAdmin
from sidecar.service.changes import ChangeRequest, ChangeRunner
from sidecar.service.compaction import Compactor
from sidecar.service.idempotency import IdempotencyCache
from sidecar.service.produce import ProduceOutcome, ProduceService
from sidecar.service.registry import TopicRegistry
from sidecar.service.topic_ports import DirectoryKafka
from sidecar.service.topics import TopicDirectory

_OPENAPI: Final = Path(__file__).with_name("openapi.json")

SIDECAR_KEY: Final = web.AppKey("sidecar", TopicRegistry)
PRODUCE_KEY: Final = web.AppKey("produce", ProduceService)
ADMIN_KEY: Final = web.AppKey("admin", TopicAdmin)
CHANGES_KEY: Final = web.AppKey("changes", ChangeRunner)
COMPACTOR_KEY: Final = web.AppKey("compactor", Compactor)
SETTINGS_KEY: Final = web.AppKey("settings", Settings)
METRICS_KEY: Final = web.AppKey("metrics", SidecarMetrics)
IDEMPOTENCY_KEY: Final = web.AppKey("idempotency", IdempotencyCache[ProduceOutcome])


def build_app(
    settings: Settings,
    sidecar: TopicRegistry,
    produce_service: ProduceService,
    admin: TopicAdmin,
    changes: ChangeRunner,
    compactor: Compactor,
    metrics: SidecarMetrics,
    kafka: DirectoryKafka,
) -> web.Application:
    app = web.Application(
        # Errors first, so that whatever the others refuse is answered like any error;
        # names, then the token and readiness, before the body is read
        # (connection_middleware reads it).
        middlewares=[
            errors_middleware,
            path_names_middleware,
            data_plane_middleware,
            connection_middleware,
        ],
        # The codec enforces the configured limit with a clear message; aiohttp's own
        # limit only has to be above it.
        client_max_size=settings.http.max_body_bytes + 1024,
    )
    app[SIDECAR_KEY] = sidecar
    app[PRODUCE_KEY] = produce_service
    app[ADMIN_KEY] = admin
    app[CHANGES_KEY] = changes
    app[COMPACTOR_KEY] = compactor
    app[SETTINGS_KEY] = settings
    app[METRICS_KEY] = metrics
    app[IDEMPOTENCY_KEY] = IdempotencyCache()
    add_ops_routes(app, sidecar, metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_post("/topics/{topic}", produce)
    app.router.add_post("/topics/{topic}/partitions/{partition}", produce)
    add_topic_routes(app, TopicDirectory(sidecar, kafka))
    add_v3_routes(app, produce_service, metrics)
    app.router.add_post("/admin/topics", admin_create)
    app.router.add_get("/admin/topics/{topic}", admin_describe)
    app.router.add_post("/admin/topics/{topic}/adopt", admin_adopt)
    app.router.add_post("/admin/topics/{topic}/partition-count", admin_change_count)
    app.router.add_post("/admin/topics/{topic}/confirm-truncation", admin_confirm_truncation)
    app.router.add_post("/admin/topics/{topic}/compaction", admin_compact)
    return app


# The data plane's gate --------------------------------------------------------------------

DATA_TOKEN_HEADER: Final = "X-Sidecar-Token"


@web.middleware
async def data_plane_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Before any data route: the token, when ``http.data_token`` is set, then readiness.

    Raises NotAuthenticated (wrong or missing token), NotReady (the sidecar has not
    finished starting: 503, retriable). The operations paths pass: they are how the app
    learns that the sidecar is ready.
    """
    if request.path in OPS_PATHS:
        return await handler(request)
    expected = request.app[SETTINGS_KEY].http.data_token
    if expected:
        supplied = request.headers.get(DATA_TOKEN_HEADER, "").encode("utf-8", "surrogateescape")
        # Constant time: how much of a guess matched must not show in the answer's timing.
        if not hmac.compare_digest(supplied, expected.encode()):
            raise DataTokenMissing(f"missing or wrong {DATA_TOKEN_HEADER} header")
    if request.path != "/openapi.json" and not request.app[SIDECAR_KEY].started:
        waiting = ", ".join(request.app[SIDECAR_KEY].waiting_for()) or "startup"
        raise NotReady(f"the sidecar is starting; waiting for: {waiting}")
    return await handler(request)


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=_OPENAPI.read_bytes(), content_type="application/json")


# Produce --------------------------------------------------------------------------------------


async def produce(request: web.Request) -> web.Response:
    app = request.app
    settings = app[SETTINGS_KEY]
    metrics = app[METRICS_KEY]
    topic = request.match_info["topic"]
    body = await request.read()
    began = time.monotonic()
    outcome_label = "error"
    served = False
    ran = False
    try:
        partition = partition_in_path(request)
        decoded = decode_produce_request(
            body,
            content_type=request.headers.get("Content-Type"),
            headers=request.headers,
            max_body_bytes=settings.http.max_body_bytes,
        )

        if partition is not None:
            # A partition named in the URL is the whole request's: one that cannot take
            # records is a 404 (or 409) for the request, as REST Proxy answers it.
            await app[TOPICS_KEY].check_writable(topic, partition)

        async def run() -> ProduceOutcome:
            nonlocal ran
            ran = True
            return await app[PRODUCE_KEY].produce(topic, decoded, partition)

        if decoded.idempotency_key is None:
            outcome = await run()
        else:
            scope = (topic, str(partition), decoded.idempotency_key)
            outcome = await app[IDEMPOTENCY_KEY].run(scope, body, run)
        served = True  # the topic exists: it is managed, or Kafka served it
        wrote = [hasattr(result, "offset") for result in outcome.results]
        written = sum(wrote)
        failed = len(outcome.results) - written
        outcome_label = "ok" if failed == 0 else ("partial" if written else "failed")
        if ran:  # a retry answered from the idempotency cache wrote nothing again
            label = metrics.topic_label(topic, exists=True)
            metrics.produce_records.labels(label, "written").inc(written)
            metrics.produce_records.labels(label, "failed").inc(failed)
            metrics.produce_bytes.labels(label).inc(
                sum(
                    len(record.key or b"") + len(record.value or b"")
                    for record, ok in zip(decoded.records, wrote, strict=False)
                    if ok
                )
            )
    except SidecarError as exc:
        outcome_label = str(exc.error_code)
        raise
    finally:
        # Labelled only with a topic known to exist, so invented names add no series.
        label = metrics.topic_label(topic, exists=served or topic in app[SIDECAR_KEY].topics)
        metrics.produce_requests.labels(label, outcome_label).inc()
        metrics.produce_latency.labels(label, outcome_label).observe(time.monotonic() - began)
    return web.Response(
        body=encode_produce_response(
            outcome.results,
            generation=outcome.generation,
            partition_count=outcome.partition_count,
        ),
        content_type=V2_RESPONSE_CONTENT_TYPE,
    )


# Admin ----------------------------------------------------------------------------------------


def _authorize(request: web.Request) -> None:
    settings = request.app[SETTINGS_KEY].http
    if not settings.admin_enabled:
        raise AdminDisabled("the admin API is disabled (http.admin_enabled = false)")
    supplied = _bearer_token(request.headers.get("Authorization", ""))
    if supplied is None or not hmac.compare_digest(supplied, settings.admin_token.encode()):
        raise NotAuthenticated("missing or wrong admin token (Authorization: Bearer <token>)")


def _bearer_token(header: str) -> bytes | None:
    """The token of ``Bearer <token>`` as the bytes sent, or None for another scheme.

    The scheme is matched without case (RFC 9110 §11.1). aiohttp decodes header bytes
    that are not UTF-8 with surrogateescape; encoding them back the same way gives the
    bytes as sent, which simply do not match (encoding strictly would raise).
    """
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    try:
        return token.strip().encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no decoder produced: not a token
        return None


async def admin_create(request: web.Request) -> web.Response:
    _authorize(request)
    document = json_object(
        await request.read(),
        {"name", "partitions", "replication_factor", "compacted", "ordered_delivery", "configs"},
        {"name", "partitions"},
    )
    configs = field(document, "configs", dict, {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in configs.items()):
        raise BadRequest("configs must map config names to string values")
    if not all(is_utf8(text) for item in configs.items() for text in item):
        raise BadRequest("configs contain a lone UTF-16 surrogate, which Kafka cannot carry")
    create = CreateTopic(
        name=names.topic_name(field(document, "name", str), "name"),
        partitions=field(document, "partitions", int),
        replication_factor=field(document, "replication_factor", int, 3),
        compacted=field(document, "compacted", bool, False),
        ordered_delivery=field(document, "ordered_delivery", bool, True),
        configs=configs,
    )
    state = await request.app[ADMIN_KEY].create(create)
    return web.json_response(topic_body(state), status=201)


async def admin_adopt(request: web.Request) -> web.Response:
    _authorize(request)
    document = json_object(await request.read(), {"compacted", "ordered_delivery"}, set())
    state = await request.app[ADMIN_KEY].adopt(
        request.match_info["topic"],
        compacted=field(document, "compacted", bool, False),
        ordered_delivery=field(document, "ordered_delivery", bool, True),
    )
    return web.json_response(topic_body(state), status=201)


async def admin_describe(request: web.Request) -> web.Response:
    _authorize(request)
    description = await request.app[ADMIN_KEY].describe(request.match_info["topic"])
    return web.json_response(description_body(description))


async def admin_confirm_truncation(request: web.Request) -> web.Response:
    """Accept the loss of the topic's lost boundaries (KIP-320): its changes go on."""
    _authorize(request)
    json_object(await request.read(), set(), set())
    topic = request.match_info["topic"]
    confirmed = await request.app[CHANGES_KEY].confirm_truncation(topic)
    return web.json_response(truncations_body(topic, confirmed))


async def admin_compact(request: web.Request) -> web.Response:
    """Compact the topic's generation log now, as far as its records are gone (the pass
    housekeeping runs every ``changes.compaction_interval_s``)."""
    _authorize(request)
    json_object(await request.read(), set(), set())
    topic = request.match_info["topic"]
    settings = request.app[SETTINGS_KEY].changes
    done = await request.app[COMPACTOR_KEY].compact(topic, lock_timeout_s=settings.lock_timeout_s)
    return web.json_response(
        {
            "topic": topic,
            "folded": done.folded,
            "first_generation": done.first_generation,
            "generation": done.current_generation,
        }
    )


async def admin_change_count(request: web.Request) -> web.Response:
    """Expand or shrink to an absolute count (KIP-195 ``increaseTo``); answers when done."""
    _authorize(request)
    document = json_object(
        await request.read(), {"count", "kind", "validate_only", "delete_after_seconds"}, {"count"}
    )
    kind = field(document, "kind", str)
    if kind is not None and kind not in {k.value for k in OperationKind}:
        raise BadRequest(f"kind must be expand or shrink, got {json.dumps(kind)}")
    delete_after = field(document, "delete_after_seconds", float)
    if delete_after is not None and delete_after < 0:
        raise BadRequest("delete_after_seconds must not be negative")
    change = ChangeRequest(
        topic=request.match_info["topic"],
        target_count=field(document, "count", int),
        validate_only=field(document, "validate_only", bool, False),
        delete_after_seconds=delete_after,
        kind=None if kind is None else OperationKind(kind),
    )
    operation = await request.app[CHANGES_KEY].change(change)
    if not change.validate_only and operation.phase is not Phase.DONE:
        raise ChangeRolledBack(f"the change was rolled back: {operation.outcome}")
    return web.json_response(operation_body(operation) | {"validate_only": change.validate_only})
