"""Shared helpers of the operations tests: repository paths, tools, PromQL names."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ordered_audit.report import prometheus_textfile
from ordered_audit.stream_metrics import StreamMetrics
from ordered_dev.harness.tools import (
    DASHBOARD,
    GRAFANA_DIR,
    ROOT,
    free_port,
    require_tool,
    substitute_grafana_variables,
)
from sidecar.metrics import SidecarMetrics

PROMETHEUS_DIR = ROOT / "prometheus"
__all__ = [
    "DASHBOARD",
    "GRAFANA_DIR",
    "ROOT",
    "free_port",
    "require_tool",
    "substitute_grafana_variables",
]


_METRIC_NAME = re.compile(r"\b(sidecar_[a-z0-9_]+)\b")


def metric_names_in(expr: str) -> set[str]:
    return set(_METRIC_NAME.findall(expr))


def exported_metric_names() -> set[str]:
    """Every series name the sidecar can export (with _total, _bucket, _sum, _count)."""
    names: set[str] = set()
    for value in vars(SidecarMetrics()).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                names |= _series_names(family)
    return names


def _series_names(family: Metric) -> set[str]:
    if family.type == "counter":
        return {f"{family.name}_total"}
    if family.type == "histogram":
        return {f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    return {family.name}


def audit_metric_names() -> frozenset[str]:
    """Metrics the alerts and the dashboard may name that the sidecar does not export:
    the ordering audit job writes ``anomalies.prom`` (for a textfile collector) and the
    live audit serves ``ordered_audit.stream_metrics``. Read from the code that writes
    them, so that a renamed metric fails the checks."""
    families = text_string_to_metric_families(prometheus_textfile({}))
    names = {sample.name for family in families for sample in family.samples}
    stream = StreamMetrics(kinds=(), max_topics=1)
    for family in stream.registry.collect():
        names |= _series_names(family)
    return frozenset(names)


AUDIT_JOB_METRICS = audit_metric_names()


@contextlib.asynccontextmanager
async def running_prometheus(config: dict[str, Any], directory: Path) -> AsyncIterator[str]:
    """Debian's Prometheus with ``config`` (its files and log in ``directory``), once it is
    ready; its URL. Stopped at the end (terminated, killed after 20 s)."""
    port = free_port()
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (directory / "prometheus.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        require_tool("prometheus"),
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(url) as session:
            await _wait_until_ready(session, process)
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=20)
        except TimeoutError:
            process.kill()
            await process.wait()
        log.close()


async def _wait_until_ready(
    session: aiohttp.ClientSession, process: asyncio.subprocess.Process
) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.returncode is None, "prometheus exited at start (see its log)"
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get("/-/ready") as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise AssertionError("prometheus was not ready within 30 s")
