"""``sidecar.compose``: what ``SidecarServer`` and ``build_consumers`` build from a Settings.

No Kafka and no ZooKeeper: constructing a server makes its clients without connecting
(kazoo's client and aiokafka's clients start only in ``start``), so the wiring is checked
on constructed objects. ``start`` is run with the registry's ``start`` (the one step that
connects to the cluster) replaced by a scripted fake; the HTTP listeners are real, on
loopback ports the system picks. What needs the real cluster (the registry's own start,
housekeeping against real ZooKeeper nodes) is left to tests/integration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest

from sidecar import compose
from sidecar.adapters.group_consumer import GroupConsumerOptions
from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.compose import SidecarServer, build_consumers
from sidecar.config import (
    AuditSettings,
    ChangeSettings,
    ConfigError,
    ConsumerSettings,
    FaultSettings,
    HttpSettings,
    KafkaSettings,
    MetricsSettings,
    ProduceSettings,
    Settings,
    StartupSettings,
    ZooKeeperSecuritySettings,
    ZooKeeperSettings,
)
from sidecar.core.errors import (
    KafkaAuthenticationFailed,
    KafkaUnavailable,
    MetadataUnavailable,
    OperationInProgress,
)
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.procedures import Phase
from sidecar.http.callback_codec import encode_callback
from sidecar.service.registry import TopicRuntime
from tests.unit.service import fakes

WITHIN_S = 5.0


def settings_for(**sections: Any) -> Settings:
    """Valid settings on loopback ports the system picks, retrying quickly at start."""
    base = Settings(
        sidecar_id="s1",
        http=HttpSettings(port=0, ops_port=0),
        startup=StartupSettings(retry_initial_s=0.01, retry_max_s=0.02),
    )
    return replace(base, **sections)


class ScriptedStart:
    """Stands in for ``TopicRegistry.start``: each call takes the next outcome (an error
    to raise, or None to succeed); with none left it fails with ``then`` or, when that is
    None, waits for ever, as a cluster that never answers."""

    def __init__(self, *outcomes: BaseException | None, then: BaseException | None = None) -> None:
        self.outcomes = list(outcomes)
        self.then = then
        self.attempts = 0

    async def __call__(self) -> None:
        self.attempts += 1
        if self.outcomes:
            outcome = self.outcomes.pop(0)
            if outcome is not None:
                raise outcome
            return
        if self.then is not None:
            raise self.then
        await asyncio.Event().wait()


Make = Callable[[Settings], SidecarServer]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    """Build servers; every one built is stopped at the end of the test."""
    built: list[SidecarServer] = []

    def build(settings: Settings) -> SidecarServer:
        server = SidecarServer(settings)
        built.append(server)
        return server

    yield build
    for server in built:
        await server.stop()


async def get(url: str) -> tuple[int, Any, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json(content_type=None), dict(response.headers)


async def post(url: str, body: object) -> tuple[int, Any, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json(content_type=None), dict(response.headers)


async def accepts_connections(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def eventually(condition: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another socket listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        yield int(blocker.getsockname()[1])


# Construction: settings into adapters and services ------------------------------------------


def test_the_settings_are_validated_before_any_client_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    monkeypatch.setattr(compose, "MetadataStore", lambda *a, **k: built.append("store"))
    monkeypatch.setattr(compose, "KafkaGateway", lambda *a, **k: built.append("kafka"))
    too_short = ZooKeeperSettings(session_timeout_s=5.0)
    with pytest.raises(ConfigError, match=r"zookeeper\.session_timeout_s \(5 s\) must exceed"):
        SidecarServer(Settings(sidecar_id="s1", zookeeper=too_short))
    with pytest.raises(ConfigError, match="'a/b' is not a sidecar id"):
        SidecarServer(Settings(sidecar_id="a/b"))
    assert built == []


def test_the_clients_are_built_from_their_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    stores: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    gateways: list[KafkaSettings] = []

    def store(*args: Any, **kwargs: Any) -> MetadataStore:
        stores.append((args, kwargs))
        return MetadataStore(*args, **kwargs)

    def gateway(settings: KafkaSettings) -> KafkaGateway:
        gateways.append(settings)
        return KafkaGateway(settings)

    monkeypatch.setattr(compose, "MetadataStore", store)
    monkeypatch.setattr(compose, "KafkaGateway", gateway)
    zookeeper = ZooKeeperSettings(
        hosts="zk-1:2181,zk-2:2181",
        root="/orders-sidecars",
        session_timeout_s=18.0,
        lock_poll_s=0.07,
        transaction_attempts=9,
        security=ZooKeeperSecuritySettings(),
    )
    kafka = KafkaSettings(bootstrap_servers="kafka-1:9092", client_id="orders-app")
    server = SidecarServer(settings_for(zookeeper=zookeeper, kafka=kafka))
    assert stores == [
        (
            ("zk-1:2181,zk-2:2181",),
            {
                "root": "/orders-sidecars",
                "session_timeout_s": 18.0,
                "lock_poll_s": 0.07,
                "transaction_attempts": 9,
                "security": zookeeper.security,
            },
        )
    ]
    assert gateways == [kafka]
    assert gateways[0] is server.settings.kafka


def test_every_part_shares_the_one_store_gateway_metrics_and_audit() -> None:
    server = SidecarServer(settings_for())
    registry = server.sidecar
    assert (registry.store, registry.kafka, registry.metrics) == (
        server.store,
        server.kafka,
        server.metrics,
    )
    for part in (server.admin, server.changes, server.retirer):
        assert part.store is server.store
        assert part.kafka is server.kafka
        assert part.metrics is server.metrics
    # One audit emitter: its buffer and its sequence of events are per sidecar.
    assert server.admin.audit is registry.audit
    assert server.changes.audit is registry.audit
    assert server.retirer.boundaries.audit is registry.audit
    assert server.produce is not None


def test_each_server_counts_in_a_registry_of_its_own() -> None:
    # Several sidecars run in one test process; their metrics must not mix.
    limits = MetricsSettings(max_topic_labels=3, max_group_labels=2)
    first = SidecarServer(settings_for(metrics=limits))
    second = SidecarServer(replace(settings_for(), sidecar_id="s2"))
    assert first.metrics.registry is not second.metrics.registry
    first.metrics.http_connections_refused.inc()
    assert first.metrics.http_connections_refused._value.get() == 1
    assert second.metrics.http_connections_refused._value.get() == 0
    assert first.metrics.limits == limits


def test_the_fault_settings_become_one_set_of_hooks_for_registry_and_changes() -> None:
    faults = FaultSettings(
        kill_after_phase="barrier",
        withhold_barrier_acks=True,
        stop_before_commit=3,
        stop_before_send=2,
        skip_fence=True,
    )
    server = SidecarServer(settings_for(faults=faults))
    assert server.faults.kill_after_phase is Phase.BARRIER
    assert server.faults.withhold_barrier_acks is True
    assert server.faults.stop_before_commit == 3
    assert server.faults.stop_before_send == 2
    assert server.faults.skip_fence is True
    assert server.sidecar.faults is server.faults
    assert server.changes.faults is server.faults


def test_no_fault_is_injected_by_default() -> None:
    faults = SidecarServer(settings_for()).faults
    assert faults.kill_after_phase is None
    assert faults.withhold_barrier_acks is False
    assert faults.stop_before_commit == 0
    assert faults.stop_before_send == 0
    assert faults.skip_fence is False


def test_changes_warm_new_partitions_under_the_sidecars_own_warm_id() -> None:
    server = SidecarServer(
        settings_for(
            kafka=KafkaSettings(client_id="orders-app"),
            changes=ChangeSettings(warm_within_s=0.75),
        )
    )
    # No lane's id ends in "~warm": warming never fences one of the sidecar's producers.
    assert server.warmer.transactional_id == "orders-app.s1~warm"
    assert server.warmer.within_s == 0.75
    assert server.changes.warmer is server.warmer


def test_changes_and_retirement_take_their_timeouts_from_the_settings() -> None:
    changes = ChangeSettings(retirement_lock_timeout_s=0.25)
    server = SidecarServer(
        settings_for(changes=changes, produce=ProduceSettings(barrier_timeout_s=25.0))
    )
    assert server.changes.sidecar_id == "s1"
    assert server.changes.barrier_timeout_s == 25.0
    assert server.changes.settings is server.settings.changes
    assert server.retirer.sidecar_id == "s1"
    assert server.retirer.lock_timeout_s == 0.25


def test_compaction_takes_its_batch_and_is_due_once_per_jittered_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    changes = ChangeSettings(compaction_interval_s=100.0, compaction_batch=7)
    server = SidecarServer(settings_for(changes=changes))
    assert (server.compactor.batch, server.compactor.sidecar_id) == (7, "s1")
    now = [1000.0]
    monkeypatch.setattr("sidecar.compose.time.monotonic", lambda: now[0])
    monkeypatch.setattr("sidecar.compose.random.random", lambda: 0.5)  # no jitter
    assert not server._compaction_due("t", 5)  # first seen: due one interval later
    now[0] += 99.0
    assert not server._compaction_due("t", 5)
    now[0] += 1.0
    assert not server._compaction_due("t", 1)  # only the current generation: not yet
    assert server._compaction_due("t", 5)
    assert not server._compaction_due("t", 5)  # next one an interval later
    now[0] += 100.0
    assert server._compaction_due("t", 5)


def test_compaction_is_never_due_with_the_interval_0() -> None:
    server = SidecarServer(settings_for(changes=ChangeSettings(compaction_interval_s=0.0)))
    assert not any(server._compaction_due("t", 5) for _ in range(3))


def test_the_connection_guard_takes_the_http_limits() -> None:
    http = HttpSettings(
        port=0,
        ops_port=0,
        max_connections=7,
        header_read_timeout_s=3.0,
        body_read_timeout_s=4.0,
        refusal_linger_s=0.5,
    )
    guard = SidecarServer(settings_for(http=http)).connections
    assert (
        guard.max_connections,
        guard.header_read_timeout_s,
        guard.body_read_timeout_s,
        guard.refusal_linger_s,
    ) == (7, 3.0, 4.0, 0.5)


def test_the_data_app_serves_produce_admin_v3_consumer_and_probe_routes() -> None:
    app = SidecarServer(settings_for()).app
    paths = {resource.canonical for resource in app.router.resources()}
    assert {
        "/topics/{topic}",
        "/admin/topics",
        "/consumers/{group}",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= paths
    assert any(path.startswith("/v3/clusters/") for path in paths)


# build_consumers ----------------------------------------------------------------------------


def test_the_consume_context_is_wired_to_this_sidecars_parts() -> None:
    settings = settings_for(
        audit=AuditSettings(sample_rate=0.25), consumer=ConsumerSettings(callback_retry_s=0.3)
    )
    server = SidecarServer(settings)
    context = server.consumers.context
    assert context.sidecar_id == "s1"
    assert context.registry is server.sidecar
    assert context.store is server.store
    assert context.offsets is server.kafka
    assert context.audit is server.sidecar.audit
    assert context.audit_sample_rate == 0.25
    assert context.settings is server.settings.consumer
    assert context.metrics.metrics is server.metrics
    assert context.faults is server.faults
    assert context.faults.ungated_delivery is False


def test_the_ungated_fault_reaches_the_consume_context() -> None:
    server = SidecarServer(settings_for(faults=FaultSettings(ungated_delivery=True)))
    assert server.consumers.context.faults.ungated_delivery is True


def test_callback_clients_use_the_callback_codec_retry_pause_and_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[dict[str, Any]] = []

    def client(url: str, **kwargs: Any) -> object:
        made.append({"url": url, **kwargs})
        return SimpleNamespace(url=url)

    monkeypatch.setattr(compose, "CallbackClient", client)
    server = SidecarServer(settings_for(consumer=ConsumerSettings(callback_retry_s=0.3)))
    context = server.consumers.context
    context.callback_client("http://app:9000/handoff", 2.5)
    assert made == [
        {
            "url": "http://app:9000/handoff",
            "timeout_s": 2.5,
            "retry_s": 0.3,
            "encode": encode_callback,
            "observe": context.metrics.callback_done,
        }
    ]


async def test_group_consumers_start_with_the_kafka_settings_and_the_ordered_assignor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    views: list[Callable[[str], Any]] = []
    started: list[tuple[KafkaSettings, GroupConsumerOptions, object]] = []

    def assignor(modes_of: Callable[[str], Any]) -> object:
        views.append(modes_of)
        return "the-assignor"

    async def start(settings: KafkaSettings, options: GroupConsumerOptions, chosen: object) -> str:
        started.append((settings, options, chosen))
        return "a-group-consumer"

    monkeypatch.setattr(compose, "ordered_assignor", assignor)
    monkeypatch.setattr(compose, "GroupConsumer", SimpleNamespace(start=start))
    server = SidecarServer(settings_for())
    options = GroupConsumerOptions(
        group="billing",
        client_suffix="reader-1",
        auto_offset_reset="earliest",
        fetch_min_bytes=1,
        metadata_max_age_ms=3000,
    )
    started_consumer = cast(Awaitable[object], server.consumers.context.start_consumer(options))
    assert await started_consumer == "a-group-consumer"
    assert started == [(server.settings.kafka, options, "the-assignor")]
    # One assignor for the sidecar, seeing the managed topics' modes as the registry does.
    [modes_of] = views
    assert modes_of("orders") is None
    runtime = fakes.runtime("orders", fakes.expanded_log(boundary=5))
    server.sidecar.topics["orders"] = cast(TopicRuntime, runtime)
    assert modes_of("orders") == (PartitionMode.READ_WRITE, PartitionMode.READ_WRITE)
    assert modes_of("payments") is None


def test_the_registrys_assignable_changes_reach_the_consumers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = SidecarServer(settings_for())
    listeners: list[Callable[[str], None]] = []
    monkeypatch.setattr(server.sidecar, "on_assignable_change", listeners.append)
    consumers = build_consumers(
        server.settings, server.sidecar, server.store, server.kafka, server.metrics
    )
    assert listeners == [consumers.assignable_changed]
    assert consumers is not server.consumers


# Start: listening first, then the dependencies -----------------------------------------------


async def test_wait_ready_before_start_is_a_programming_error(make: Make) -> None:
    server = make(settings_for())
    with pytest.raises(RuntimeError, match=r"wait_ready\(\) before start\(\)"):
        await server.wait_ready()


async def test_both_ports_listen_and_answer_before_the_cluster_does(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make(settings_for())
    monkeypatch.setattr(server.sidecar, "start", ScriptedStart())  # never answers
    await server.start()
    assert server.port not in (None, 0)
    assert server.ops_port not in (None, 0, server.port)
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert server.ops_url == f"http://127.0.0.1:{server.ops_port}"
    # Liveness never depends on the cluster; readiness says what it waits for.
    assert (await get(f"{server.ops_url}/healthz"))[:2] == (200, {"status": "ok"})
    status, body, _ = await get(f"{server.ops_url}/readyz")
    assert status == 503
    assert body["ready"] is False
    assert body["waiting_for"] == ["kafka", "zookeeper", "producers"]
    # The data plane answers too, with a retriable refusal rather than a reset connection.
    status, body, headers = await post(f"{server.url}/topics/orders", {"records": []})
    assert (status, body["error_code"], headers["Retry-After"]) == (503, 50360, "1")
    # The operations port serves the probes only.
    assert (await post(f"{server.ops_url}/topics/orders", {"records": []}))[0] == 404


async def test_a_data_port_in_use_is_a_config_error_naming_the_setting(
    make: Make, busy_port: int
) -> None:
    server = make(settings_for(http=HttpSettings(port=busy_port, ops_port=0)))
    with pytest.raises(ConfigError) as raised:
        await server.start()
    message = str(raised.value)
    assert message.startswith(f"http.port: cannot listen on 127.0.0.1:{busy_port}: ")
    assert "address already in use" in message.lower()


async def test_an_ops_port_in_use_is_a_config_error_and_stop_frees_the_data_port(
    make: Make, busy_port: int
) -> None:
    server = make(settings_for(http=HttpSettings(port=0, ops_port=busy_port)))
    with pytest.raises(ConfigError, match=rf"^http\.ops_port: cannot listen on .*:{busy_port}: "):
        await server.start()
    # The data listener was up already; whoever saw the error stops the server.
    assert server.port is not None
    data_port = server.port
    assert await accepts_connections(data_port)
    await server.stop()
    assert not await accepts_connections(data_port)


async def test_an_outage_at_start_is_retried_until_the_dependencies_answer(
    make: Make, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sidecar.compose")
    server = make(settings_for())
    start = ScriptedStart(
        KafkaUnavailable("cannot reach Kafka at kafka-1:9092"),
        MetadataUnavailable("cannot connect to ZooKeeper"),
        None,
    )
    monkeypatch.setattr(server.sidecar, "start", start)
    await server.start()
    await asyncio.wait_for(server.wait_ready(), WITHIN_S)
    assert start.attempts == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "sidecar.compose"]
    assert len(warnings) == 2
    assert warnings[0].startswith(
        "not ready (waiting for kafka, zookeeper, producers): "
        "cannot reach Kafka at kafka-1:9092; trying again in "
    )
    assert "cannot connect to ZooKeeper; trying again in" in warnings[1]


async def test_a_bug_at_start_is_logged_with_its_traceback_and_retried(
    make: Make, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="sidecar.compose")
    server = make(settings_for())
    start = ScriptedStart(RuntimeError("unexpected"), None)
    monkeypatch.setattr(server.sidecar, "start", start)
    await server.start()
    await asyncio.wait_for(server.wait_ready(), WITHIN_S)
    assert start.attempts == 2
    [record] = [r for r in caplog.records if r.name == "sidecar.compose"]
    assert record.getMessage().startswith("starting failed (waiting for kafka")
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)


@pytest.mark.parametrize(
    "error",
    [
        KafkaAuthenticationFailed("kafka.security.sasl_password: refused"),
        ConfigError("kafka.security.ssl_certfile: the certificate expired"),
    ],
    ids=["refused-identity", "unusable-setting"],
)
async def test_an_error_retrying_cannot_fix_ends_the_start_at_once(
    make: Make, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    server = make(settings_for())
    start = ScriptedStart(then=error)
    monkeypatch.setattr(server.sidecar, "start", start)
    await server.start()
    with pytest.raises(type(error)) as raised:
        await asyncio.wait_for(server.wait_ready(), WITHIN_S)
    assert raised.value is error
    await asyncio.sleep(0.05)  # several retry pauses: none is taken
    assert start.attempts == 1


async def test_stop_ends_a_start_that_is_still_retrying(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make(settings_for())
    start = ScriptedStart(then=KafkaUnavailable("away"))
    monkeypatch.setattr(server.sidecar, "start", start)
    await server.start()
    await eventually(lambda: start.attempts >= 2)
    await asyncio.wait_for(server.stop(), WITHIN_S)
    attempts = start.attempts
    await asyncio.sleep(0.05)
    assert start.attempts == attempts


# Stop: nothing half-written -----------------------------------------------------------------


async def test_stop_closes_http_first_then_consumers_warmer_registry_and_probes_last(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make(settings_for())
    monkeypatch.setattr(server.sidecar, "start", ScriptedStart(None))
    await server.start()
    await asyncio.wait_for(server.wait_ready(), WITHIN_S)
    assert server.port is not None
    assert server.ops_port is not None
    data_port, ops_port = server.port, server.ops_port
    steps: list[tuple[str, bool, bool]] = []

    def observed(name: str, original: Callable[[], Awaitable[None]]) -> Callable[[], Any]:
        async def step() -> None:
            steps.append(
                (name, await accepts_connections(data_port), await accepts_connections(ops_port))
            )
            await original()

        return step

    monkeypatch.setattr(server.consumers, "close", observed("consumers", server.consumers.close))
    monkeypatch.setattr(server.warmer, "stop", observed("warmer", server.warmer.stop))
    monkeypatch.setattr(server.sidecar, "stop", observed("registry", server.sidecar.stop))
    await asyncio.wait_for(server.stop(), WITHIN_S)
    # (step, data port still open, operations port still open)
    assert steps == [
        ("consumers", False, True),
        ("warmer", False, True),
        ("registry", False, True),
    ]
    assert not await accepts_connections(ops_port)


async def test_stop_twice_stops_once(make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    server = make(settings_for())
    stops: list[str] = []
    original = server.sidecar.stop

    async def stop() -> None:
        stops.append("registry")
        await original()

    monkeypatch.setattr(server.sidecar, "stop", stop)
    await server.stop()
    await server.stop()
    assert stops == ["registry"]


async def test_a_server_never_started_stops_without_a_cluster(make: Make) -> None:
    server = make(settings_for())
    await asyncio.wait_for(server.stop(), WITHIN_S)
    assert server.port is None


# Housekeeping, once ready -------------------------------------------------------------------


@dataclass
class FakeRuntime:
    """A managed topic as housekeeping reads it (its log, published barrier and partition
    modes, as the topic's watch last read them); a partition waits to retire."""

    log: GenerationLog
    pending: object
    modes: tuple[PartitionMode, ...] = (PartitionMode.READ_WRITE, PartitionMode.READ_ONLY)
    state: SimpleNamespace = field(init=False)

    def __post_init__(self) -> None:
        self.state = SimpleNamespace(log=self.log, pending=self.pending, modes=self.modes)

    def notify(self) -> None:
        pass


async def test_housekeeping_checks_boundaries_once_then_every_round_resumes_and_retires(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make(settings_for(changes=ChangeSettings(housekeeping_interval_s=0.01)))
    log_a, log_b = fakes.expanded_log(boundary=4), GenerationLog.start(3)
    server.sidecar.topics.update(
        {
            "a": cast(TopicRuntime, FakeRuntime(log_a, pending="barrier-of-a")),
            "b": cast(TopicRuntime, FakeRuntime(log_b, pending=None)),
        }
    )
    checked: list[dict[str, GenerationLog]] = []
    calls: list[str] = []

    async def report_lost(logs: dict[str, GenerationLog]) -> dict[str, int | None]:
        checked.append(dict(logs))
        return {}

    async def release_leftover_locks() -> list[str]:
        calls.append("locks")
        if calls.count("locks") == 1:
            raise MetadataUnavailable("ZooKeeper away")
        return []

    async def resume_abandoned(topic: str, pending: object) -> None:
        calls.append(f"resume {topic} {pending}")
        if topic == "a" and calls.count("locks") == 1:
            raise OperationInProgress("another sidecar holds the lock")

    async def retire(topic: str) -> dict[int, object]:
        calls.append(f"retire {topic}")
        return {}

    monkeypatch.setattr(server.sidecar, "start", ScriptedStart(None))
    monkeypatch.setattr(server.changes.boundaries, "report_lost", report_lost)
    monkeypatch.setattr(server.store, "release_leftover_locks", release_leftover_locks)
    monkeypatch.setattr(server.changes, "resume_abandoned", resume_abandoned)
    monkeypatch.setattr(server.retirer, "retire", retire)
    await server.start()
    await asyncio.wait_for(server.wait_ready(), WITHIN_S)
    await eventually(lambda: calls.count("locks") >= 3)
    await server.stop()
    assert checked == [{"a": log_a, "b": log_b}]
    rounds: list[list[str]] = []
    for call in calls:
        if call == "locks":
            rounds.append([])
        rounds[-1].append(call)
    # Round 1: ZooKeeper away for the locks and a's lock taken; b is still looked after.
    assert rounds[0] == ["locks", "resume a barrier-of-a", "resume b None", "retire b"]
    # Later rounds: a's turn comes again; nothing was given up for good.
    assert rounds[1] == [
        "locks",
        "resume a barrier-of-a",
        "retire a",
        "resume b None",
        "retire b",
    ]


async def test_housekeeping_outlives_unexpected_errors_and_stop_still_shuts_down(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bug or an untranslated client error once ended the task for good (no change
    # resumed, no partition retired again), and stop() then raised it before shutting
    # anything down. ZooKeeper away at the first boundary check ended it too.
    server = make(settings_for(changes=ChangeSettings(housekeeping_interval_s=0.01)))
    server.sidecar.topics.update(
        {"a": cast(TopicRuntime, FakeRuntime(GenerationLog.start(2), pending=None))}
    )
    calls: list[str] = []

    async def report_lost(logs: dict[str, GenerationLog]) -> dict[str, int | None]:
        calls.append("boundaries")
        raise MetadataUnavailable("ZooKeeper away")

    async def release_leftover_locks() -> list[str]:
        calls.append("locks")
        if calls.count("locks") == 1:
            raise KeyError("an untranslated client error")
        return []

    async def resume_abandoned(topic: str, pending: object) -> None:
        calls.append(f"resume {topic}")

    async def retire(topic: str) -> dict[int, object]:
        calls.append(f"retire {topic}")
        if calls.count(f"retire {topic}") == 1:
            raise RuntimeError("a bug")
        return {}

    stopped: list[str] = []
    original_stop = server.sidecar.stop

    async def registry_stop() -> None:
        stopped.append("registry")
        await original_stop()

    monkeypatch.setattr(server.sidecar, "start", ScriptedStart(None))
    monkeypatch.setattr(server.sidecar, "stop", registry_stop)
    monkeypatch.setattr(server.changes.boundaries, "report_lost", report_lost)
    monkeypatch.setattr(server.store, "release_leftover_locks", release_leftover_locks)
    monkeypatch.setattr(server.changes, "resume_abandoned", resume_abandoned)
    monkeypatch.setattr(server.retirer, "retire", retire)
    await server.start()
    await asyncio.wait_for(server.wait_ready(), WITHIN_S)
    await eventually(lambda: calls.count("retire a") >= 3)
    await asyncio.wait_for(server.stop(), WITHIN_S)
    assert calls[:4] == ["boundaries", "locks", "resume a", "retire a"]
    assert stopped == ["registry"]


async def test_housekeeping_reads_no_topic_without_a_partition_to_retire(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An idle sidecar's rounds must cost ZooKeeper little: retirement reads the topic
    # again, so it runs only where the watched modes show a read-only partition.
    server = make(settings_for(changes=ChangeSettings(housekeeping_interval_s=0.01)))
    every_partition_written = (PartitionMode.READ_WRITE,) * 3
    server.sidecar.topics.update(
        {
            "idle": cast(
                TopicRuntime,
                FakeRuntime(GenerationLog.start(3), pending=None, modes=every_partition_written),
            ),
            "shrunk": cast(TopicRuntime, FakeRuntime(GenerationLog.start(2), pending=None)),
        }
    )
    retired: list[str] = []

    async def report_lost(logs: dict[str, GenerationLog]) -> dict[str, int | None]:
        return {}

    async def release_leftover_locks() -> list[str]:
        return []

    async def resume_abandoned(topic: str, pending: object) -> None:
        return None

    async def retire(topic: str) -> dict[int, object]:
        retired.append(topic)
        return {}

    monkeypatch.setattr(server.sidecar, "start", ScriptedStart(None))
    monkeypatch.setattr(server.changes.boundaries, "report_lost", report_lost)
    monkeypatch.setattr(server.store, "release_leftover_locks", release_leftover_locks)
    monkeypatch.setattr(server.changes, "resume_abandoned", resume_abandoned)
    monkeypatch.setattr(server.retirer, "retire", retire)
    await server.start()
    await asyncio.wait_for(server.wait_ready(), WITHIN_S)
    await eventually(lambda: retired.count("shrunk") >= 3)
    await server.stop()
    assert set(retired) == {"shrunk"}
