"""The operations listener: ``/healthz``, ``/readyz`` and ``/metrics``, nothing else.

It has a port of its own and may listen on any address (the pod IP, for kubelet and
Prometheus), while the data plane stays on loopback. A data route asked here is a 404
like any unknown path. The data plane answers the same three paths too, so the app can
ask its own sidecar on localhost.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sidecar.http.error_map import errors_middleware
from sidecar.metrics import SidecarMetrics
from sidecar.service.registry import TopicRegistry

OPS_SIDECAR_KEY: Final = web.AppKey("ops_sidecar", TopicRegistry)
OPS_METRICS_KEY: Final = web.AppKey("ops_metrics", SidecarMetrics)
OPS_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})


def build_ops_app(sidecar: TopicRegistry, metrics: SidecarMetrics) -> web.Application:
    app = web.Application(middlewares=[errors_middleware])
    add_ops_routes(app, sidecar, metrics)
    return app


def add_ops_routes(app: web.Application, sidecar: TopicRegistry, metrics: SidecarMetrics) -> None:
    app[OPS_SIDECAR_KEY] = sidecar
    app[OPS_METRICS_KEY] = metrics
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)


async def healthz(request: web.Request) -> web.Response:
    """The process answers: for a liveness probe, never depends on Kafka or ZooKeeper."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 once Kafka, ZooKeeper and the transactional producers are there; otherwise
    503 naming what is still waited for."""
    sidecar = request.app[OPS_SIDECAR_KEY]
    ready = sidecar.ready
    return web.json_response(
        {
            "ready": ready,
            "waiting_for": [] if ready else sidecar.waiting_for(),
            "zookeeper": sidecar.zookeeper_state.value,
        },
        status=200 if ready else 503,
    )


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = generate_latest(request.app[OPS_METRICS_KEY].registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
