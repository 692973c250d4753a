"""Render the Grafana dashboard's panels from real data, as PNG charts.

Grafana itself is not installable from this project's package sources, so this runs
the same queries the dashboard does against a real Prometheus (Debian's package)
scraping two real sidecars and the live audit (``start_stream``, embedded, over the
audit topic both sidecars write), during a scenario with produce load, a consumer group
and four partition-count changes, each followed by a producer writing past the
sidecars (the live audit counts its records as ``unaudited_delivery`` once the group
gets them), and draws each panel with matplotlib.

    .venv/bin/python -m bench.dashboard [--out docs/dashboard.png] [--seconds 70]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import matplotlib
from aiokafka import AIOKafkaProducer

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import yaml

from ordered_audit.job import SparkOptions, build_session
from ordered_audit.stream import RunningStream, StreamConfig, start_stream
from ordered_dev.devcluster.provider import provide_cluster
from ordered_dev.harness.consumers import CallbackApp, create_consumer
from ordered_dev.harness.sidecars import RunningSidecar, running_sidecars, unique
from ordered_dev.harness.tools import (
    DASHBOARD,
    free_port,
    require_tool,
    substitute_grafana_variables,
)

ROOT = Path(__file__).resolve().parents[1]


async def _produce(sidecar: RunningSidecar, topic: str, stop: asyncio.Event) -> None:
    sequence = 0
    while not stop.is_set():
        records = [{"key": f"key-{(sequence + i) % 200}", "value": sequence} for i in range(10)]
        await sidecar.produce(topic, records)
        sequence += 10
        await asyncio.sleep(0.01)


async def _consume(
    sidecar: RunningSidecar,
    group: str,
    name: str,
    topic: str,
    stop: asyncio.Event,
    callback_url: str | None = None,
) -> None:
    config: dict[str, object] = {"auto.commit.enable": "true", "consumer.request.timeout.ms": 500}
    if callback_url is not None:
        config["callback_url"] = callback_url
    consumer = await create_consumer(sidecar, group, name, **config)
    await consumer.subscribe(topic)
    while not stop.is_set():
        status, body = await consumer.call("GET", "/records", timeout="300")
        if status == 200:
            events = [item["event_id"] for item in body if "type" in item]
            if events:
                await consumer.ack(*events)
        await asyncio.sleep(0.05)


async def _scenario(sidecars: list[RunningSidecar], seconds: float) -> list[tuple[float, str]]:
    """Load, a consumer group, and changes; returns (time, label) of each change."""
    topic = unique("orders")
    group = unique("billing")
    await sidecars[0].create_topic(topic, 3, replication_factor=3, compacted=True)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_produce(s, topic, stop)) for s in sidecars]
    app = CallbackApp()
    await app.start()
    tasks += [
        asyncio.create_task(_consume(sidecars[1], group, "c0", topic, stop)),
        asyncio.create_task(_consume(sidecars[1], group, "c1", topic, stop, app.url)),
    ]
    changes: list[tuple[float, str]] = []
    began = time.monotonic()
    plan = [(0.15, 4), (0.3, 6), (0.5, 4), (0.65, 5)]
    try:
        for fraction, count in plan:
            await asyncio.sleep(max(0.0, began + fraction * seconds - time.monotonic()))
            await sidecars[len(changes) % 2].change_count(topic, count, delete_after_seconds=5)
            changes.append((time.time(), f"→ {count}"))
            # An app that routed with the generation before: fenced (409), and one
            # that claims a generation nobody has: unknown (503).
            await sidecars[0].produce(
                topic, [{"key": "k", "value": 0}], extra={"expected_generation": 0}
            )
            await sidecars[0].produce(
                topic, [{"key": "k", "value": 0}], extra={"expected_generation": 99}
            )
            await _bypass(cluster_bootstrap(sidecars[0]), topic)
        await asyncio.sleep(max(0.0, began + seconds - time.monotonic()))
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await app.stop()
    return changes


def cluster_bootstrap(sidecar: RunningSidecar) -> str:
    return sidecar.server.settings.kafka.bootstrap_servers


async def _bypass(bootstrap: str, topic: str) -> None:
    """A producer that writes past the sidecars: its records lack the sidecar headers."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for _ in range(5):
            await producer.send_and_wait(topic, b"1", key=b'"rogue"', partition=0)
    finally:
        await producer.stop()


def _targets() -> list[tuple[str, list[str]]]:
    dashboard = json.loads(DASHBOARD.read_text())
    names = {v["name"] for v in dashboard["templating"]["list"]}
    panels = []
    for panel in dashboard["panels"]:
        if panel.get("type") == "row":
            continue
        exprs = [
            substitute_grafana_variables(t["expr"], names).replace(
                "[1m]", "[10s]"
            )  # a 70 s run: Grafana's minute window would smear it
            for t in panel.get("targets", [])
            if t.get("expr")
        ]
        panels.append((panel["title"], exprs))
    return panels


async def _range(
    session: aiohttp.ClientSession, expr: str, start: float, end: float
) -> list[dict[str, Any]]:
    params = {"query": expr, "start": str(start), "end": str(end), "step": "1"}
    async with session.get("/api/v1/query_range", params=params) as response:
        body = await response.json()
    result: list[dict[str, Any]] = body.get("data", {}).get("result", [])
    return result


def _draw(
    panels: list[tuple[str, list[list[dict[str, Any]]]]],
    changes: list[tuple[float, str]],
    start: float,
    out: Path,
) -> None:
    columns = 4
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.4 * rows))
    for axis, (title, series_sets) in zip(axes.flat, panels, strict=False):
        axis.set_title(title, fontsize=8)
        axis.tick_params(labelsize=6)
        drawn = 0
        for series_set in series_sets:
            for series in series_set[:8]:
                points = [(float(t) - start, float(v)) for t, v in series["values"]]
                if points:
                    xs, ys = zip(*points, strict=True)
                    axis.plot(xs, ys, linewidth=0.9)
                    drawn += 1
        for at, label in changes:
            axis.axvline(at - start, color="grey", linestyle=":", linewidth=0.8)
            axis.text(at - start, 1.0, label, fontsize=5, transform=axis.get_xaxis_transform())
        if not drawn:
            axis.text(
                0.5,
                0.5,
                "no data",
                ha="center",
                va="center",
                fontsize=8,
                color="grey",
                transform=axis.transAxes,
            )
    for axis in list(axes.flat)[len(panels) :]:
        axis.axis("off")
    figure.suptitle("ordered-sidecar dashboard, from a real Prometheus (x: seconds)", fontsize=10)
    figure.tight_layout()
    figure.savefig(out, dpi=80)


async def _live_audit(bootstrap: str, topic: str, checkpoint: Path) -> RunningStream:
    """The live audit over ``topic`` in this process (its own Spark session), once its
    ``/metrics`` answers."""
    spark = await asyncio.to_thread(
        build_session, SparkOptions(master="local[2]", shuffle_partitions=2), kafka=True
    )
    config = StreamConfig(
        bootstrap=bootstrap, topic=topic, checkpoint=checkpoint, trigger_s=1.0, metrics_port=0
    )
    return await asyncio.to_thread(start_stream, spark, config)


async def main(out: Path, seconds: float) -> None:
    prometheus = require_tool("prometheus")
    with provide_cluster() as cluster, tempfile.TemporaryDirectory() as work:
        audit_topic = unique("audit")
        async with running_sidecars(cluster, 2, audit_topic=audit_topic) as sidecars:
            # The sidecars made the audit topic as they started: the stream reads it whole.
            stream = await _live_audit(cluster.kafka_bootstrap, audit_topic, Path(work) / "live")
            port = free_port()
            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "ordered-sidecar",
                        "static_configs": [
                            {"targets": [f"127.0.0.1:{s.server.port}" for s in sidecars]}
                        ],
                    },
                    {
                        "job_name": "ordered-audit-stream",
                        "static_configs": [{"targets": [f"127.0.0.1:{stream.port}"]}],
                    },
                ],
            }
            (Path(work) / "prometheus.yml").write_text(yaml.safe_dump(config))
            process = await asyncio.create_subprocess_exec(
                prometheus,
                f"--config.file={Path(work) / 'prometheus.yml'}",
                f"--storage.tsdb.path={Path(work) / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            try:
                async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
                    for _ in range(100):
                        with contextlib.suppress(aiohttp.ClientError):
                            async with session.get("/-/ready") as response:
                                if response.status == 200:
                                    break
                        await asyncio.sleep(0.2)
                    start = time.time()
                    changes = await _scenario(sidecars, seconds)
                    # The last change's bypassing records: delivered, audited, counted.
                    await asyncio.sleep(10)
                    end = time.time()
                    panels = [
                        (title, [await _range(session, e, start, end) for e in exprs])
                        for title, exprs in _targets()
                    ]
            finally:
                process.terminate()
                await process.wait()
                await asyncio.to_thread(stream.stop)
    _draw(panels, changes, start, out)
    empty = [title for title, sets in panels if not any(sets)]
    print(f"wrote {out}; panels without data: {empty or 'none'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    parser.add_argument("--seconds", type=float, default=70.0)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.out, arguments.seconds))
