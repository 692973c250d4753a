"""One running sidecar: adapters, service and HTTP server wired from one Settings.

``SidecarServer`` is what ``sidecar serve`` runs and what the tests start (several in
one process, each with its own id, port and metrics registry).

Shutdown order matters for "nothing half-written": first the HTTP server stops
accepting and waits for the requests in progress (their sends complete), then the
producer flushes, then the ZooKeeper session closes (its registration goes away
last, so no coordinator skips this sidecar while it still writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from aiohttp import web

from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.config import Settings
from sidecar.core.errors import SidecarError
from sidecar.core.procedures import Phase
from sidecar.http.access_log import access_log_options
from sidecar.http.app import build_app
from sidecar.http.connections import LINGERING_TIME_S, ConnectionGuard, GuardedSite
from sidecar.http.connections import install as install_connection_guard
from sidecar.http.consumer_routes import add_routes as add_consumer_routes
from sidecar.metrics import SidecarMetrics
from sidecar.service.admin import TopicAdmin
from sidecar.service.changes import ChangeRunner
from sidecar.service.consumers import Consumers
from sidecar.service.retirement import Retirer
from sidecar.service.sidecar import Sidecar

_log = logging.getLogger(__name__)

HOUSEKEEPING_S = 2.0
"""How often a sidecar looks for changes whose coordinator died and for partitions to
retire (every sidecar does; the topic lock makes one of them act)."""
SHUTDOWN_GRACE_S = 30.0


class SidecarServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings.validate()
        self.metrics = SidecarMetrics()
        self.store = MetadataStore(
            settings.zookeeper.hosts,
            root=settings.zookeeper.root,
            session_timeout_s=settings.zookeeper.session_timeout_s,
        )
        self.kafka = KafkaGateway(settings.kafka)
        self.sidecar = Sidecar(settings, self.store, self.kafka, self.metrics)
        self.admin = TopicAdmin(self.store, self.kafka, self.metrics, self.sidecar.audit)
        self.changes = ChangeRunner(
            settings.sidecar_id,
            self.store,
            self.kafka,
            self.metrics,
            barrier_timeout_s=settings.produce.barrier_timeout_s,
            kill_after_phase=Phase(settings.faults.kill_after_phase)
            if settings.faults.kill_after_phase
            else None,
            audit=self.sidecar.audit,
        )
        self.retirer = Retirer(settings.sidecar_id, self.store, self.kafka, self.metrics)
        self.consumers = Consumers(self.sidecar)
        self.app = build_app(settings, self.sidecar, self.admin, self.changes, self.metrics)
        add_consumer_routes(self.app, self.consumers)
        self.connections = ConnectionGuard(
            max_connections=settings.http.max_connections,
            header_read_timeout_s=settings.http.header_read_timeout_s,
            body_read_timeout_s=settings.http.body_read_timeout_s,
            metrics=self.metrics,
        )
        install_connection_guard(self.app, self.connections)
        self._runner: web.AppRunner | None = None
        self._janitor: asyncio.Task[None] | None = None
        self.port: int | None = None
        self._stopped = False

    @property
    def url(self) -> str:
        return f"http://{self.settings.http.host}:{self.port}"

    async def start(self) -> None:
        await self.sidecar.start()
        http = self.settings.http
        self._runner = web.AppRunner(
            self.app,
            shutdown_timeout=SHUTDOWN_GRACE_S,
            handle_signals=False,
            keepalive_timeout=http.keepalive_timeout_s,
            lingering_time=LINGERING_TIME_S,
            **access_log_options(http.access_log),
        )
        await self._runner.setup()
        site = GuardedSite(self._runner, http.host, http.port, self.connections)
        await site.start()
        self.port = site.port  # the bound one, when the configured port is 0
        self._janitor = asyncio.create_task(self._housekeeping())
        _log.info("sidecar %s listening on %s", self.settings.sidecar_id, self.url)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
        if self._runner is not None:
            await self._runner.cleanup()  # stops accepting, waits for handlers
        await self.consumers.close()
        await self.sidecar.stop()

    async def _housekeeping(self) -> None:
        """Release change locks left by interrupted attempts, finish changes nobody
        drives, and retire drained partitions."""
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            try:
                await self.store.release_leftover_locks()
            except SidecarError as exc:
                _log.debug("leftover locks not checked: %s", exc.message)
            for topic in list(self.sidecar.topics):
                try:
                    await self.changes.resume_abandoned(topic)
                    await self.retirer.retire(topic)
                except SidecarError as exc:
                    # Another sidecar holds the lock or ZooKeeper is away: next round.
                    _log.debug("housekeeping of %s deferred: %s", topic, exc.message)


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    server = SidecarServer(settings)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"sidecar {settings.sidecar_id} ready on {server.url}", flush=True)
    await stop.wait()
    await server.stop()
