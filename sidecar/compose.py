"""The composition root: builds adapters and services and hands them to each other.

The one module that knows every layer. ``SidecarServer`` is one running sidecar wired
from one Settings: what ``sidecar serve`` runs and what the tests start (several in one
process, each with its own id, port and metrics registry). The consume path gets its
adapters (the group consumer, the callback client with the HTTP layer's callback codec)
from ``build_consumers``.

Shutdown order matters for "nothing half-written": first the HTTP server stops
accepting and waits for the requests in progress (their sends complete), then the
producer flushes, then the ZooKeeper session closes (its registration goes away
last, so no coordinator skips this sidecar while it still writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Sequence

from aiohttp import web

from sidecar.adapters.callbacks import CallbackClient
from sidecar.adapters.group_consumer import GroupConsumer, GroupConsumerOptions, ordered_assignor
from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.partition_warmer import PartitionWarmer
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.config import ConfigError, Settings
from sidecar.core.backoff import Backoff, jittered
from sidecar.core.errors import SidecarError
from sidecar.core.generations import PartitionMode
from sidecar.core.procedures import Phase, warm_transactional_id
from sidecar.faults import FaultHooks
from sidecar.http.access_log import access_log_options
from sidecar.http.app import build_app
from sidecar.http.callback_codec import encode_callback
from sidecar.http.connections import ConnectionGuard, GuardedSite
from sidecar.http.connections import install as install_connection_guard
from sidecar.http.consumer_routes import add_routes as add_consumer_routes
from sidecar.http.ops import build_ops_app
from sidecar.metrics import SidecarMetrics
from sidecar.service.admin import TopicAdmin
from sidecar.service.changes import ChangeRunner
from sidecar.service.compaction import Compactor
from sidecar.service.consume_context import ConsumeContext, ConsumerMetrics
from sidecar.service.consumers import Consumers
from sidecar.service.produce import ProduceService
from sidecar.service.registry import TopicRegistry
from sidecar.service.retirement import Retirer

_log = logging.getLogger(__name__)


class SidecarServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings.validate()
        self.metrics = SidecarMetrics(limits=settings.metrics)
        self.store = MetadataStore(
            settings.zookeeper.hosts,
            root=settings.zookeeper.root,
            session_timeout_s=settings.zookeeper.session_timeout_s,
            lock_poll_s=settings.zookeeper.lock_poll_s,
            transaction_attempts=settings.zookeeper.transaction_attempts,
            security=settings.zookeeper.security,
        )
        self.kafka = KafkaGateway(settings.kafka)
        faults = settings.faults
        self.faults = FaultHooks(
            kill_after_phase=Phase(faults.kill_after_phase) if faults.kill_after_phase else None,
            withhold_barrier_acks=faults.withhold_barrier_acks,
            stop_before_commit=faults.stop_before_commit,
            stop_before_send=faults.stop_before_send,
            skip_fence=faults.skip_fence,
            stop_before_compaction_write=faults.stop_before_compaction_write,
            ungated_delivery=faults.ungated_delivery,
        )
        self.sidecar = TopicRegistry(
            settings, self.store, self.kafka, self.metrics, faults=self.faults
        )
        self.admin = TopicAdmin(self.store, self.kafka, self.metrics, self.sidecar.audit)
        self.warmer = PartitionWarmer(
            settings.kafka,
            warm_transactional_id(settings.kafka.client_id, settings.sidecar_id),
            settings.changes.warm_within_s,
        )
        self.changes = ChangeRunner(
            settings.sidecar_id,
            self.store,
            self.kafka,
            self.metrics,
            barrier_timeout_s=settings.produce.barrier_timeout_s,
            faults=self.faults,
            audit=self.sidecar.audit,
            settings=settings.changes,
            warmer=self.warmer,
        )
        self.retirer = Retirer(
            settings.sidecar_id,
            self.store,
            self.kafka,
            self.metrics,
            lock_timeout_s=settings.changes.retirement_lock_timeout_s,
            audit=self.sidecar.audit,
        )
        self.compactor = Compactor(
            settings.sidecar_id,
            self.store,
            self.kafka,
            self.metrics,
            batch=settings.changes.compaction_batch,
            lock_timeout_s=settings.changes.retirement_lock_timeout_s,
            faults=self.faults,
        )
        self._next_compaction: dict[str, float] = {}
        """Per managed topic, when (monotonic) this sidecar next tries to compact it."""
        self.consumers = build_consumers(
            self.settings, self.sidecar, self.store, self.kafka, self.metrics, self.faults
        )
        self.produce = ProduceService(settings, self.sidecar, self.kafka, self.metrics)
        self.app = build_app(
            settings,
            self.sidecar,
            self.produce,
            self.admin,
            self.changes,
            self.compactor,
            self.metrics,
            self.kafka,
        )
        add_consumer_routes(self.app, self.consumers)
        self.connections = ConnectionGuard(
            max_connections=settings.http.max_connections,
            header_read_timeout_s=settings.http.header_read_timeout_s,
            body_read_timeout_s=settings.http.body_read_timeout_s,
            refusal_linger_s=settings.http.refusal_linger_s,
            metrics=self.metrics,
        )
        install_connection_guard(self.app, self.connections)
        self._runner: web.AppRunner | None = None
        self._janitor: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        self._ops_runner: web.AppRunner | None = None
        self.port: int | None = None
        self.ops_port: int | None = None
        self._stopped = False

    @property
    def url(self) -> str:
        """The data plane's address (loopback unless ``http.host`` says otherwise)."""
        return f"http://{self.settings.http.host}:{self.port}"

    @property
    def ops_url(self) -> str:
        """The operations listener's address (``/healthz``, ``/readyz``, ``/metrics``)."""
        return f"http://{self.settings.http.ops_host}:{self.ops_port}"

    async def start(self) -> None:
        """Listen on both ports at once, then connect to Kafka and ZooKeeper in the
        background, retrying with backoff and jitter until it succeeds or ``stop``.

        Until then ``/readyz`` answers 503 with what is still waited for and data routes
        answer 503 (NotReady). Raises ConfigError when a port cannot be bound.
        """
        http = self.settings.http
        self._runner = web.AppRunner(
            self.app,
            shutdown_timeout=self.settings.http.shutdown_grace_s,
            handle_signals=False,
            keepalive_timeout=http.keepalive_timeout_s,
            lingering_time=http.lingering_time_s,
            **access_log_options(http.access_log),
        )
        await self._runner.setup()
        site = GuardedSite(self._runner, http.host, http.port, self.connections)
        await _listen(site, "http.port", http.host, http.port)
        self.port = site.port  # the bound one, when the configured port is 0
        self._ops_runner = web.AppRunner(
            build_ops_app(self.sidecar, self.metrics), handle_signals=False, access_log=None
        )
        await self._ops_runner.setup()
        ops_site = web.TCPSite(self._ops_runner, http.ops_host, http.ops_port)
        await _listen(ops_site, "http.ops_port", http.ops_host, http.ops_port)
        self.ops_port = _bound_port(ops_site, http.ops_port)
        _log.info(
            "sidecar %s listening on %s (operations on %s); connecting to Kafka and ZooKeeper",
            self.settings.sidecar_id,
            self.url,
            self.ops_url,
        )
        self._starting = asyncio.create_task(self._start_dependencies())

    async def wait_ready(self) -> None:
        """Return once every dependency has started (``/readyz`` may still say 503 later,
        while one is away)."""
        if self._starting is None:
            raise RuntimeError("wait_ready() before start()")
        await asyncio.shield(self._starting)

    async def _start_dependencies(self) -> None:
        startup = self.settings.startup
        backoff = Backoff(startup.retry_initial_s, startup.retry_max_s)
        attempt = 0
        while True:
            try:
                await self.sidecar.start()
                break
            except Exception as exc:
                # A setting the clients cannot be built from (an expired certificate, a
                # key its password does not open), or an identity the cluster refuses:
                # trying again cannot help, the process ends with one line.
                if isinstance(exc, ConfigError) or (
                    isinstance(exc, SidecarError) and exc.fatal_at_start
                ):
                    raise
                attempt += 1
                delay = backoff.delay(attempt, random.random())
                waiting = ", ".join(self.sidecar.waiting_for())
                if isinstance(exc, SidecarError):
                    _log.warning(
                        "not ready (waiting for %s): %s; trying again in %.1f s",
                        waiting,
                        exc.message,
                        delay,
                    )
                else:  # a bug, not an outage: keep its traceback, and keep trying
                    _log.exception("starting failed (waiting for %s)", waiting)
                await asyncio.sleep(delay)
        self._janitor = asyncio.create_task(self._housekeeping())
        _log.info("sidecar %s ready on %s", self.settings.sidecar_id, self.url)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for task in (self._starting, self._janitor):
            if task is not None:
                task.cancel()
                # A start that gave up raised already to whoever waited for readiness.
                with contextlib.suppress(asyncio.CancelledError, SidecarError, ConfigError):
                    await task
        if self._runner is not None:
            await self._runner.cleanup()  # stops accepting, waits for handlers
        await self.consumers.close()
        await self.warmer.stop()
        await self.sidecar.stop()
        if self._ops_runner is not None:
            # Last: /readyz answers 503 (stopping) while the rest shuts down.
            await self._ops_runner.cleanup()

    async def _housekeeping(self) -> None:
        """Check the managed topics' boundaries against log truncation once (KIP-320: a
        truncation while no sidecar ran is reported at once, not at the next change);
        then, every round, release change locks left by interrupted attempts, finish
        changes nobody drives, withdraw barriers no change owns, and retire drained
        partitions; and every ``changes.compaction_interval_s`` (jittered) per topic,
        compact its generation log."""
        try:
            await self.changes.boundaries.report_lost(
                {topic: runtime.state.log for topic, runtime in self.sidecar.topics.items()}
            )
        except SidecarError as exc:
            _log.info("boundaries not checked at start (at the next change): %s", exc.message)
        except Exception:
            _log.exception("checking boundaries at start failed")
        while True:
            await asyncio.sleep(
                jittered(self.settings.changes.housekeeping_interval_s, random.random())
            )
            try:
                await self.store.release_leftover_locks()
            except SidecarError as exc:
                _log.debug("leftover locks not checked: %s", exc.message)
            except Exception:
                _log.exception("checking leftover locks failed; next round")
            for gone in set(self._next_compaction) - set(self.sidecar.topics):
                del self._next_compaction[gone]
            for topic, runtime in list(self.sidecar.topics.items()):
                try:
                    await self.changes.resume_abandoned(topic, runtime.state.pending)
                    # The partition modes as the topic's watch last read them: a round
                    # reads the topic again only where a partition waits to retire.
                    if PartitionMode.READ_ONLY in runtime.state.modes:
                        await self.retirer.retire(topic)
                    if self._compaction_due(topic, len(runtime.state.log.generations)):
                        await self.compactor.compact(topic, seen=runtime.state)
                except SidecarError as exc:
                    # Another sidecar holds the lock or ZooKeeper is away: next round.
                    _log.debug("housekeeping of %s deferred: %s", topic, exc.message)
                except Exception:
                    # A bug or an untranslated client error: the task must outlive it
                    # (ended, no change would be resumed and no partition retired, and
                    # stop() would meet the error instead of shutting down).
                    _log.exception("housekeeping of %s failed; next round", topic)

    def _compaction_due(self, topic: str, generations: int) -> bool:
        """True once per ``changes.compaction_interval_s`` (jittered, from when this
        sidecar first saw the topic) for a topic whose log has more than its current
        generation; never with the interval 0. Due or not, a round costs no request."""
        interval = self.settings.changes.compaction_interval_s
        if interval <= 0:
            return False
        now = time.monotonic()
        due = self._next_compaction.setdefault(topic, now + jittered(interval, random.random()))
        if now < due or generations <= 1:
            return False
        self._next_compaction[topic] = now + jittered(interval, random.random())
        return True


async def _listen(site: web.BaseSite, setting: str, host: str, port: int) -> None:
    """Start ``site``; a port that cannot be bound is a configuration error."""
    try:
        await site.start()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot listen on {host}:{port}: {exc.strerror}") from exc


def _bound_port(site: web.TCPSite, configured: int) -> int:
    server = site._server  # aiohttp keeps the asyncio server here; no public accessor
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else configured


def build_consumers(
    settings: Settings,
    sidecar: TopicRegistry,
    store: MetadataStore,
    kafka: KafkaGateway,
    metrics: SidecarMetrics,
    faults: FaultHooks | None = None,
) -> Consumers:
    """The consumer-instance registry, wired to this sidecar's adapters."""
    consumer_metrics = ConsumerMetrics(metrics)

    def modes_of(topic: str) -> Sequence[PartitionMode] | None:
        runtime = sidecar.topics.get(topic)
        return None if runtime is None else runtime.state.modes

    assignor = ordered_assignor(modes_of)

    async def start_consumer(options: GroupConsumerOptions) -> GroupConsumer:
        return await GroupConsumer.start(settings.kafka, options, assignor)

    def callback_client(url: str, timeout_s: float) -> CallbackClient:
        return CallbackClient(
            url,
            timeout_s=timeout_s,
            retry_s=settings.consumer.callback_retry_s,
            encode=encode_callback,
            observe=consumer_metrics.callback_done,
        )

    context = ConsumeContext(
        sidecar_id=settings.sidecar_id,
        registry=sidecar,
        store=store,
        offsets=kafka,
        audit=sidecar.audit,
        audit_sample_rate=settings.audit.sample_rate,
        settings=settings.consumer,
        metrics=consumer_metrics,
        start_consumer=start_consumer,
        callback_client=callback_client,
        faults=faults or FaultHooks(),
    )
    consumers = Consumers(context)
    sidecar.on_assignable_change(consumers.assignable_changed)
    return consumers
