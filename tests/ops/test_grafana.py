"""The Grafana dashboard and provisioning files.

Static: the JSON's structure (unique ids, grid positions inside the 24 columns without
overlaps, datasource references that resolve, a query in every panel), every query
parses as PromQL once Grafana's variables are substituted, and names only metrics the
sidecar, the audit job or the live audit export (read from their code). Integration: a
real Prometheus (Debian's binary) scrapes two running sidecars every second, the
ordering audit's textfile output and the live audit's own ``/metrics``, while the test
produces load, expands the topic until produces were held, makes a record of the new
partition wait at the gate until another instance of its group (on the other sidecar)
commits the blocking partition, with hand-off callbacks (the first of which fails),
writes one record around the sidecar, sends a fenced and an unknown-generation
produce, and folds a generation of a second topic whose records were deleted (as
retention would); then every panel query must return series through Prometheus' HTTP
API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import promql_parser
import pytest
import yaml
from aiohttp import web
from aiokafka import AIOKafkaProducer

from ordered_audit.report import prometheus_textfile
from ordered_audit.stream_metrics import StreamMetrics
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.consumers import CallbackApp, create_consumer
from ordered_dev.harness.sidecars import RunningSidecar, running_sidecars, unique
from tests.ops.support import (
    AUDIT_JOB_METRICS,
    DASHBOARD,
    GRAFANA_DIR,
    PROMETHEUS_DIR,
    exported_metric_names,
    free_port,
    metric_names_in,
    require_tool,
    running_prometheus,
    substitute_grafana_variables,
)

PROVISIONED_DATASOURCES = GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = GRAFANA_DIR / "provisioning" / "dashboards" / "ordered-sidecar.yml"


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def panels() -> list[dict[str, Any]]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def variables() -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in dashboard()["templating"]["list"]}


def queries(*, annotations: bool = True) -> list[tuple[str, str]]:
    """(where, PromQL as Prometheus receives it) for every panel target and annotation."""
    names = set(variables())
    found = [
        (f"{panel['title']} / {target['refId']}", target["expr"])
        for panel in panels()
        for target in panel["targets"]
    ]
    if annotations:
        found += annotation_queries()
    return [(where, substitute_grafana_variables(expr, names)) for where, expr in found]


def annotation_queries() -> list[tuple[str, str]]:
    return [
        (f"annotation {item['name']}", item["expr"])
        for item in dashboard()["annotations"]["list"]
        if "expr" in item
    ]


# Structure ------------------------------------------------------------------------------


def test_panel_ids_are_unique_and_grid_positions_fit_without_overlap() -> None:
    every = dashboard()["panels"]
    ids = [panel["id"] for panel in every]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in every:
        grid = panel["gridPos"]
        assert all(isinstance(grid[key], int) for key in ("h", "w", "x", "y")), panel["title"]
        assert grid["w"] > 0
        assert grid["h"] > 0
        assert grid["x"] >= 0
        assert grid["y"] >= 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for column in range(grid["x"], grid["x"] + grid["w"]):
            for line in range(grid["y"], grid["y"] + grid["h"]):
                other = cells.setdefault((column, line), panel["title"])
                assert other == panel["title"], f"{panel['title']} overlaps {other}"


def test_datasource_references_resolve() -> None:
    provisioned = yaml.safe_load(PROVISIONED_DATASOURCES.read_text())["datasources"]
    uids = {source["uid"] for source in provisioned}
    datasource_variables = {
        name for name, variable in variables().items() if variable["type"] == "datasource"
    }
    assert {
        variable["query"] for variable in variables().values() if variable["type"] == "datasource"
    } == {"prometheus"}

    def resolves(reference: dict[str, Any]) -> bool:
        uid = reference["uid"]
        if uid.startswith("${") and uid.endswith("}"):
            return uid[2:-1] in datasource_variables
        return uid in uids

    references = [panel["datasource"] for panel in panels()]
    references += [target["datasource"] for panel in panels() for target in panel["targets"]]
    references += [v["datasource"] for v in variables().values() if "datasource" in v]
    references += [a["datasource"] for a in dashboard()["annotations"]["list"] if "expr" in a]
    assert references
    for reference in references:
        assert reference["type"] == "prometheus"
        assert resolves(reference), reference


def test_every_panel_has_a_query() -> None:
    for panel in panels():
        targets = panel["targets"]
        assert targets, panel["title"]
        assert all(target["expr"].strip() for target in targets), panel["title"]
        ref_ids = [target["refId"] for target in targets]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_every_query_parses_as_promql_and_names_known_metrics() -> None:
    known = exported_metric_names() | AUDIT_JOB_METRICS
    for where, expr in queries():
        try:
            promql_parser.parse(expr)
        except ValueError as exc:
            raise AssertionError(f"{where}: {expr!r} does not parse: {exc}") from exc
        assert not metric_names_in(expr) - known, f"{where} names unknown metrics"
    # The variables' own queries: label_values(<selector>, label).
    for name, variable in variables().items():
        if variable["type"] == "query":
            definition = variable["query"]["query"]
            assert definition.startswith("label_values(")
            assert definition.endswith(")")
            selector = definition[len("label_values(") : definition.rindex(",")]
            promql_parser.parse(substitute_grafana_variables(selector, set(variables())))
            assert variable["allValue"] == ".*", name


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    every = " ".join(expr for _, expr in queries())
    for metric in (
        "sidecar_produce_requests_total",
        "sidecar_produce_latency_seconds_bucket",
        "sidecar_produce_held_requests",
        "sidecar_produce_hold_seconds_bucket",
        "sidecar_produce_fenced_total",
        "sidecar_produce_unknown_generation_total",
        "sidecar_topic_generation",
        "sidecar_topic_undeleted_partitions",
        "sidecar_barrier_phase_seconds_sum",
        "sidecar_gated_partitions",
        "sidecar_gate_wait_seconds_bucket",
        "sidecar_handoff_callback_seconds_count",
        "sidecar_audit_anomalies_total",
        "sidecar_audit_stream_anomalies_total",
        "sidecar_audit_stream_lag_seconds",
        "sidecar_audit_stream_events_total",
        "sidecar_topic_generation_log_length",
        "sidecar_generations_folded_total",
    ):
        assert metric in every, metric
    assert "histogram_quantile(0.5," in every
    assert "histogram_quantile(0.99," in every


def test_one_panel_shows_live_audit_anomalies_beside_the_change_and_gate_metrics() -> None:
    """The issue's "anomalies beside the sidecars' change and gate metrics on one time
    axis": one panel, not three panels that happen to share the dashboard's time range."""
    names = set(variables())
    beside = [
        panel
        for panel in panels()
        if any("sidecar_audit_stream_anomalies_total" in t["expr"] for t in panel["targets"])
        and any("sidecar_gated_partitions" in t["expr"] for t in panel["targets"])
        and any("sidecar_topic_generation" in t["expr"] for t in panel["targets"])
    ]
    assert len(beside) == 1, [panel["title"] for panel in beside]
    # Anomalies per interval by kind and topic, the first count of a new series included
    # (increase() would need two samples of it: the first anomaly would not show).
    (anomalies,) = [
        t for t in beside[0]["targets"] if "sidecar_audit_stream_anomalies_total" in t["expr"]
    ]
    expr = substitute_grafana_variables(anomalies["expr"], names)
    assert expr.startswith("sum by (kind, topic) (")
    assert "increase(" not in expr
    assert "* 0" in expr
    assert expr.count("offset 1m") == 1


def test_the_provisioning_files_point_at_the_dashboard() -> None:
    providers = yaml.safe_load(PROVIDERS.read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")
    sources = yaml.safe_load(PROVISIONED_DATASOURCES.read_text())
    assert sources["apiVersion"] == 1
    assert [s["type"] for s in sources["datasources"]] == ["prometheus"]
    assert dashboard()["uid"] == "ordered-sidecar"
    assert [p.name for p in (GRAFANA_DIR / "dashboards").iterdir()] == [DASHBOARD.name]


# Against a real Prometheus ---------------------------------------------------------------


async def produce_until(sidecar: RunningSidecar, topic: str, stop: asyncio.Event) -> list[int]:
    """Keyed produces in a loop (the same 64 keys, so expansions move some of them)."""
    statuses: list[int] = []
    sequence = 0
    while not stop.is_set():
        records = [
            {"key": f"key-{(sequence + i) % 64}", "value": {"n": sequence}} for i in range(8)
        ]
        status, _ = await sidecar.produce(topic, records)
        statuses.append(status)
        sequence += 8
        await asyncio.sleep(0.005)
    return statuses


def total(sidecars: list[RunningSidecar], name: str, topic: str) -> float:
    """``name`` summed over the sidecars and every label set of ``topic`` (or none)."""
    found = 0.0
    for sidecar in sidecars:
        for family in sidecar.server.metrics.registry.collect():
            for series in family.samples:
                if series.name == name and series.labels.get("topic", topic) == topic:
                    found += series.value
    return found


@contextlib.asynccontextmanager
async def stream_metrics_server() -> AsyncIterator[str]:
    """The live audit's ``/metrics`` (its own metrics server) after one micro-batch with an
    anomaly; yields its scrape target."""
    metrics = StreamMetrics(kinds={"nonmonotonic"}, max_topics=5)
    metrics.record_batch(
        events=10, late=1, newest=time.time(), anomalies={("nonmonotonic", "orders"): 2}
    )
    port = metrics.serve("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        metrics.close()


@contextlib.asynccontextmanager
async def audit_textfile_server(anomalies: dict[str, int]) -> AsyncIterator[str]:
    """The ordering audit's ``anomalies.prom``, served as node_exporter's textfile
    collector would serve it; yields its scrape target."""
    body = prometheus_textfile(anomalies)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def query(session: aiohttp.ClientSession, expr: str) -> list[Any]:
    async with session.get("/api/v1/query", params={"query": expr}) as response:
        body = await response.json()
    assert response.status == 200, (expr, body)
    assert body["status"] == "success", (expr, body)
    result: list[Any] = body["data"]["result"]
    return result


@pytest.mark.integration
async def test_every_panel_query_returns_series_from_a_real_prometheus(
    cluster: ClusterEndpoints, tmp_path: Path
) -> None:
    require_tool("prometheus")  # fails here, before any cluster work, if it is missing
    app = CallbackApp(fail_first=1)  # one failed callback: the failures panel has a series
    await app.start()
    try:
        async with (
            running_sidecars(cluster, 2) as sidecars,
            audit_textfile_server({"lost": 0, "nonmonotonic": 1}) as audit_target,
            stream_metrics_server() as stream_target,
        ):
            topic = unique("ops-dashboard")
            # Compacted, so that keys moved by the expansion get relocation tombstones.
            await sidecars[0].create_topic(
                topic, 3, replication_factor=cluster.replication_factor, compacted=True
            )
            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(PROMETHEUS_DIR / "alerts.yml")],
                "scrape_configs": [
                    {
                        "job_name": "ordered-sidecar",
                        "static_configs": [
                            {"targets": [f"127.0.0.1:{s.server.port}" for s in sidecars]}
                        ],
                    },
                    {"job_name": "ordered-audit", "static_configs": [{"targets": [audit_target]}]},
                    {
                        "job_name": "ordered-audit-stream",
                        "static_configs": [{"targets": [stream_target]}],
                    },
                ],
            }
            async with (
                running_prometheus(config, tmp_path) as url,
                aiohttp.ClientSession(url) as session,
            ):
                await exercise_the_sidecars(sidecars, topic, cluster, app.url)
                await check_queries(session, tmp_path)
    finally:
        await app.stop()


async def exercise_the_sidecars(
    sidecars: list[RunningSidecar], topic: str, cluster: ClusterEndpoints, callback_url: str
) -> None:
    # Two instances of one group with manual assignments, so that a record certainly
    # waits at the gate: the blocker owns partition 0 and does not read until the
    # instance that owns partition 3 (split from 0 by the first expansion) is waiting.
    group = unique("ops-group")
    blocker = await create_consumer(sidecars[0], group, "blocker", callback_url=callback_url)
    waiter = await create_consumer(sidecars[1], group, "waiter", callback_url=callback_url)
    await blocker.assign((topic, 0))
    stop = asyncio.Event()
    load = [asyncio.create_task(produce_until(sidecar, topic, stop)) for sidecar in sidecars]
    try:
        await asyncio.sleep(2)
        # Expand until a produce was held at a barrier (nearly always the first time).
        count = 3
        while not total(sidecars, "sidecar_produce_hold_seconds_count", topic):
            assert count < 6, "no produce was held across three expansions"
            count += 1
            await sidecars[0].change_count(topic, count)
            await asyncio.sleep(1)
        await waiter.assign((topic, 3))
        deadline = time.monotonic() + 20
        while not total(sidecars, "sidecar_gated_partitions", topic):
            assert time.monotonic() < deadline, "partition 3 never waited for partition 0"
            records, _ = await waiter.poll(200)
            assert records == []
        # The blocker reads and commits past the boundary (its keys_revoked callback
        # first): the waiter's records are released, after its keys_assigned callback.
        deadline = time.monotonic() + 30
        released: list[dict[str, Any]] = []
        while not released:
            assert time.monotonic() < deadline, "the gate did not open"
            await blocker.poll(200)
            status, body = await blocker.commit()
            assert status == 204, body
            released, _ = await waiter.poll(200)
        # One record written around the sidecar: delivered, and counted as such.
        producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"raw", key=b"around-the-sidecar", partition=0)
        finally:
            await producer.stop()
        deadline = time.monotonic() + 20
        while not total(sidecars, "sidecar_records_without_sidecar_headers_total", topic):
            assert time.monotonic() < deadline, "the record without headers was not delivered"
            await blocker.poll(200)
        await asyncio.sleep(2)  # moved keys are produced again: relocation tombstones
        fenced, _ = await sidecars[1].produce(
            topic, [{"key": "k", "value": 1}], extra={"expected_generation": 0}
        )
        unknown, _ = await sidecars[1].produce(
            topic, [{"key": "k", "value": 1}], extra={"expected_generation": 999}
        )
        # Newer than any generation there is: 409 40911, counted as an unknown generation.
        assert (fenced, unknown) == (409, 409)
        await fold_a_generation(sidecars[0], unique("ops-folded"), cluster)
        await asyncio.sleep(3)  # several scrapes after every event
    finally:
        stop.set()
        statuses = await asyncio.gather(*load)
    for instance in (blocker, waiter):
        await instance.delete()
    assert {status for run in statuses for status in run} == {200}
    assert total(sidecars, "sidecar_gate_wait_seconds_count", topic) > 0
    assert total(sidecars, "sidecar_relocation_tombstones_total", topic) > 0
    assert total(sidecars, "sidecar_handoff_callback_failures_total", topic) >= 1


async def fold_a_generation(sidecar: RunningSidecar, topic: str, cluster: ClusterEndpoints) -> None:
    """Expand a topic nobody reads, delete its records below generation 1's boundaries
    (what retention does) and run a compaction pass: generation 0 is folded."""
    await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
    status, _ = await sidecar.produce(topic, [{"key": f"k{i}", "value": i} for i in range(8)])
    assert status == 200
    assert (await sidecar.change_count(topic, 3))["phase"] == "done"
    [generation] = [g for g in (await sidecar.describe(topic))["generations"] if g["number"] == 1]
    boundaries = [offset for offset, _ in generation["boundaries"]]
    await sidecar.server.kafka.delete_records(topic, dict(enumerate(boundaries)))
    status, body = await sidecar.admin("POST", f"/admin/topics/{topic}/compaction", {})
    assert (status, body.get("folded")) == (200, 1), body


async def check_queries(session: aiohttp.ClientSession, tmp_path: Path) -> None:
    panel_queries = queries(annotations=False)
    assert len(panel_queries) >= 25
    deadline = time.monotonic() + 30
    while True:
        empty = [where for where, expr in panel_queries if not await query(session, expr)]
        if not empty:
            break
        assert time.monotonic() < deadline, (
            f"no series for {empty} (log: {(tmp_path / 'prometheus.log').read_text()[-2000:]})"
        )
        await asyncio.sleep(1)
    # Accepted, series or not: the annotation has series only within a minute of a
    # generation change.
    names = set(variables())
    events = [(where, substitute_grafana_variables(e, names)) for where, e in annotation_queries()]
    for _, expr in events:
        await query(session, expr)
    # The alert rules evaluate against the real series without errors.
    async with session.get("/api/v1/rules") as response:
        groups = (await response.json())["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert rules
    assert all(rule["health"] in {"ok", "unknown"} for rule in rules), rules
