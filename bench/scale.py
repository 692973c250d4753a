"""How the sidecar's cost grows with the deployment: idle ZooKeeper load per sidecar,
and start time against the number of managed topics.

Run from the repository root::

    .venv/bin/python -m bench.scale [--sidecars 1 3 10] [--topics 1] [--window 60]
                                     [--topics-start 1 100] [--lanes 1] [--changes 5]
                                     [--report bench/results/scale.md]

One dev cluster (``provide_cluster()``: ZooKeeper and 3 KRaft brokers, which do not use
ZooKeeper, so every request ZooKeeper counts is a sidecar's or the benchmark's probe).

**Idle ZooKeeper load.** First the baseline: ZooKeeper's ``Received`` counter (``srvr``
over a socket to its client port: the packets it received since it started, pings
included) over ``--window`` seconds with no sidecar running (so it also shows whether
the benchmark's own four-letter probes count). Then ``sidecar serve`` processes are
started until each count of ``--sidecars`` is reached (one ZooKeeper root, one
deployment), ``--topics`` managed topics are created through the first sidecar's admin
API (3 partitions each, replication factor 3), and for each count: every sidecar ready
(``/readyz`` 200), then
``--quiet`` seconds with nothing sent to any sidecar, then ``Received`` over the window,
again with no traffic. Requests per second per idle sidecar = (the window's rate - the
baseline's rate) / sidecars. ``stat`` gives each connection's received packets at both
ends of the window: their spread says whether every sidecar costs the same. Each
sidecar's RSS is VmRSS from ``/proc/<pid>/status`` at the end of the window; CPU is
sampled over the window.

The sidecars run with the product's defaults (ZooKeeper session 15 s, housekeeping every
2 s, topic-list fallback read every 10 s) except ``kafka.transaction_lanes`` (``--lanes``,
1 by default instead of 3: each lane is a transactional producer, and one is what a
sidecar with little traffic needs) and the listeners' ports. Sidecar 0 runs under
``bench.zk_calls``, which counts every request of its kazoo client by operation, path
and the sidecar code that made it (and every heartbeat ping): the table of where an
idle sidecar's requests come from.

**Start time.** With the idle fleet stopped but sidecar 0, managed topics are added (1
partition, replication factor 3, through sidecar 0's admin API) until each count of
``--topics-start`` is reached; at each count one more ``sidecar serve`` is started
``--start-repeats`` times (stopped after each): the time from starting the process until
its ``/readyz`` answers 200 (polled every 20 ms), the ZooKeeper requests its session
made until then (``stat``: the new connection), and its RSS at that moment and
``--settle`` seconds later (after its first housekeeping round). The first count is
measured once more with 3 lanes (the default) to show what ``--lanes`` saves.

**A change's time.** After each idle window, ``--changes`` expansions of one more topic
(created with 1 partition before the first), each by one partition, one after the
other: the admin request's time until it answers with the change done, and ZooKeeper's
``Received`` over them. With ``--paused-change``, one more expansion while the fleet's
last sidecar is stopped (SIGSTOP): the barrier waits for its ack until ZooKeeper expires
its session (``zookeeper.session_timeout_s``), so the change should take that timeout and
not more; the sidecar is then resumed and waited for until ready again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aiohttp

from bench.harness import parse_samples, total
from bench.machine import cluster_pids, cores, kafka_line, process_ticks, remove_data
from bench.report import RESULTS_DIR, markdown_table, measure_and_write
from bench.soak import rss_kib
from bench.zk_calls import ENV as COUNT_ENV
from bench.zk_calls import read_counts
from ordered_dev.devcluster.provider import ClusterEndpoints, provide_cluster
from ordered_dev.harness.sidecars import (
    ADMIN_TOKEN,
    free_port,
    settings_environment,
    settings_for,
    terminate,
)
from sidecar.config import Settings

GOAL_PER_SIDECAR = 1.0
"""ZooKeeper requests per second an idle sidecar may cost (the product's goal)."""
IDLE_PARTITIONS = 3
START_PARTITIONS = 1
CREATE_CONCURRENCY = 8
READY_POLL_S = 0.02
READY_WITHIN_S = 120.0
REPOSITORY = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Plan:
    sidecars: tuple[int, ...]
    topics: int
    window_s: float
    quiet_s: float
    topics_start: tuple[int, ...]
    start_repeats: int
    settle_s: float
    lanes: int
    changes: int = 0
    paused_change: bool = False


# ZooKeeper's four-letter words -----------------------------------------------------------


def four_letter(hosts: str, command: str, timeout_s: float = 5.0) -> tuple[str, str]:
    """``command``'s answer from the first server of ``hosts``, and the probe's own
    address as ZooKeeper lists it (``ip:port``)."""
    host, _, port = hosts.split(",")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as probe:
        own = "{}:{}".format(*probe.getsockname()[:2])
        probe.sendall(command.encode())
        chunks = []
        while chunk := probe.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace"), own


def parse_srvr(text: str) -> dict[str, int]:
    """The counters of a ``srvr`` answer: Received, Sent, Connections, Outstanding, Node
    count (whatever of them it has)."""
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("Received", "Sent", "Connections", "Outstanding", "Node count"):
            values[name.strip()] = int(value.strip())
    if "Received" not in values:
        raise RuntimeError(f"ZooKeeper's srvr answer has no Received counter: {text[:300]!r}")
    return values


_STAT_CONNECTION = re.compile(r"^\s*/(\S+?)\[\d+\]\((?:[^)]*?,)?recved=(\d+)")


def parse_stat_connections(text: str, own: str = "") -> dict[str, int]:
    """Each client connection of a ``stat`` answer (``ip:port`` -> packets received),
    the probe's own (``own``) left out."""
    connections = {}
    for line in text.splitlines():
        match = _STAT_CONNECTION.match(line)
        if match and match.group(1) != own:
            connections[match.group(1)] = int(match.group(2))
    return connections


async def zookeeper_counters(hosts: str) -> dict[str, int]:
    text, _ = await asyncio.to_thread(four_letter, hosts, "srvr")
    return parse_srvr(text)


async def zookeeper_connections(hosts: str) -> dict[str, int]:
    text, own = await asyncio.to_thread(four_letter, hosts, "stat")
    return parse_stat_connections(text, own)


# Sidecar processes -----------------------------------------------------------------------


@dataclass
class Running:
    name: str
    process: asyncio.subprocess.Process
    url: str
    ops_url: str
    ready_s: float
    counts: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid


def sidecar_settings(cluster: ClusterEndpoints, root: str, name: str, lanes: int) -> Settings:
    """The product's defaults (not the tests' shorter timing) but ``lanes`` lanes, on
    ports chosen here (the operations port is polled before the sidecar says anything)."""
    defaults = Settings(sidecar_id="defaults")
    settings = settings_for(
        cluster,
        root,
        name,
        session_timeout_s=defaults.zookeeper.session_timeout_s,
        request_timeout_ms=defaults.kafka.request_timeout_ms,
        transaction_lanes=lanes,
    )
    http = dataclasses.replace(settings.http, port=_unused_port(), ops_port=_unused_port())
    return dataclasses.replace(settings, http=http)


_HANDED_OUT: set[int] = set()
"""Every port this run gave a sidecar."""


def _unused_port() -> int:
    """A free loopback port no sidecar of this run was given before. The kernel's picks
    repeat: among 200 of some 28,000 ephemeral ports, two alike are more likely than
    not, and the sidecar that then fails to bind can pass for ready on the answer of
    the one that holds its port."""
    while True:
        port = free_port()
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


PORT_TAKEN_EXIT = 2
"""``sidecar serve``'s exit status for a configuration error, a port taken among them."""
START_ATTEMPTS = 3


async def start_sidecar(
    cluster: ClusterEndpoints,
    root: str,
    name: str,
    lanes: int,
    log: IO[bytes],
    http: aiohttp.ClientSession,
    counts: Path | None = None,
) -> Running:
    """``sidecar serve`` (under ``bench.zk_calls`` counting into ``counts`` if given);
    returns once its ``/readyz`` answers 200, with the time that took (of the last
    attempt). Started again on other ports if it exits at once with a configuration
    error: with dozens starting together, a port ``free_port`` found free can be taken
    by another before the sidecar binds it."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return await _start_sidecar_once(cluster, root, name, lanes, log, http, counts)
        except SidecarExited as exc:
            if exc.returncode != PORT_TAKEN_EXIT or attempt == START_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


class SidecarExited(RuntimeError):
    def __init__(self, name: str, returncode: int) -> None:
        super().__init__(f"sidecar {name} exited with {returncode}")
        self.returncode = returncode


async def _start_sidecar_once(
    cluster: ClusterEndpoints,
    root: str,
    name: str,
    lanes: int,
    log: IO[bytes],
    http: aiohttp.ClientSession,
    counts: Path | None,
) -> Running:
    settings = sidecar_settings(cluster, root, name, lanes)
    env = dict(os.environ) | settings_environment(settings)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPOSITORY), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    if counts is None:
        command = [str(Path(sys.executable).with_name("sidecar")), "serve"]
    else:
        env[COUNT_ENV] = str(counts)
        command = [sys.executable, "-m", "bench.zk_calls", "serve"]
    ops_url = f"http://{settings.http.ops_host}:{settings.http.ops_port}"
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log, cwd=REPOSITORY
    )
    running = Running(
        settings.sidecar_id,
        process,
        f"http://{settings.http.host}:{settings.http.port}",
        ops_url,
        0.0,
        counts,
    )
    try:
        while True:
            if process.returncode is not None:
                raise SidecarExited(name, process.returncode)
            if time.monotonic() - began > READY_WITHIN_S:
                raise RuntimeError(f"sidecar {name} not ready within {READY_WITHIN_S:.0f} s")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{ops_url}/readyz") as response:
                    if response.status == 200:
                        running.ready_s = time.monotonic() - began
                        return running
            await asyncio.sleep(READY_POLL_S)
    except BaseException:
        await stop_sidecar(running)
        raise


async def stop_sidecar(running: Running) -> None:
    await terminate(running.process)


async def create_topics(
    http: aiohttp.ClientSession,
    sidecar: Running,
    names: Sequence[str],
    partitions: int,
    replication_factor: int,
) -> None:
    """Managed topics through ``sidecar``'s admin API, a few at a time."""
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def create(name: str) -> None:
        body = {"name": name, "partitions": partitions, "replication_factor": replication_factor}
        async with (
            gate,
            http.post(
                f"{sidecar.url}/admin/topics",
                json=body,
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            ) as response,
        ):
            if response.status != 201:
                raise RuntimeError(f"creating {name}: {response.status} {await response.text()}")

    await asyncio.gather(*(create(name) for name in names))


# Idle windows ----------------------------------------------------------------------------


@dataclass
class Window:
    """ZooKeeper's and the sidecars' figures over one idle window."""

    sidecars: int
    topics: int
    seconds: float
    received: int
    connections: dict[str, int]
    """Packets received per client connection present at both ends of the window."""
    rss_kib: list[int]
    """Per sidecar at the end of the window; sidecar 0 (counting) first."""
    sidecar_cpu: float
    """% of one core, all sidecars together."""
    zookeeper_cpu: float
    cluster_cpu: float
    machine_cpu: float
    load: tuple[float, float, float]
    counted: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Sidecar 0's kazoo requests in the window, by (operation, path, caller)."""

    @property
    def rate(self) -> float:
        return self.received / self.seconds


def _machine_busy() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values[:8]) - values[3] - values[4], sum(values[:8])


async def measure_window(
    hosts: str,
    fleet: Sequence[Running],
    topics: int,
    window_s: float,
    zookeeper_pid: int | None,
    broker_pids: Sequence[int],
) -> Window:
    counts_file = fleet[0].counts if fleet else None
    counted_before = read_counts(counts_file) if counts_file else Counter()
    connections_before = await zookeeper_connections(hosts)
    before = await zookeeper_counters(hosts)
    began = time.monotonic()
    sidecar_ticks = sum(process_ticks(s.pid) for s in fleet)
    zookeeper_ticks = process_ticks(zookeeper_pid) if zookeeper_pid else 0
    broker_ticks = sum(process_ticks(pid) for pid in broker_pids)
    busy, total = _machine_busy()
    await asyncio.sleep(window_s)
    after = await zookeeper_counters(hosts)
    seconds = time.monotonic() - began
    connections_after = await zookeeper_connections(hosts)
    counted_after = read_counts(counts_file) if counts_file else Counter()
    busy_after, total_after = _machine_busy()

    def percent(ticks: int) -> float:
        return ticks / CLOCK_TICKS / seconds * 100

    for sidecar in fleet:
        if sidecar.process.returncode is not None:
            raise RuntimeError(f"sidecar {sidecar.name} exited during the window")
    return Window(
        sidecars=len(fleet),
        topics=topics,
        seconds=seconds,
        received=after["Received"] - before["Received"],
        connections={
            address: connections_after[address] - count
            for address, count in connections_before.items()
            if address in connections_after
        },
        rss_kib=[rss_kib(s.pid) for s in fleet],
        sidecar_cpu=percent(sum(process_ticks(s.pid) for s in fleet) - sidecar_ticks),
        zookeeper_cpu=percent(process_ticks(zookeeper_pid) - zookeeper_ticks)
        if zookeeper_pid
        else float("nan"),
        cluster_cpu=percent(sum(process_ticks(pid) for pid in broker_pids) - broker_ticks),
        machine_cpu=(busy_after - busy) / max(1, total_after - total) * 100 * cores(),
        load=os.getloadavg(),
        counted=counted_after - counted_before,
    )


# Changes against the fleet ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Changes:
    """``count`` expansions of one topic, one after the other, with the fleet idle."""

    sidecars: int
    seconds: list[float]
    """Each change, from the admin request to its answer (phase done)."""
    barrier_to_commit: list[float]
    """Each change, from its barrier published to its generation committed: the
    coordinator's ``sidecar_barrier_phase_seconds`` of the phases in between."""
    received: int
    """ZooKeeper packets received during the changes (every sidecar and the probe)."""
    window_s: float


BARRIER_TO_COMMIT = ("barrier", "fencing", "reading_boundaries", "committing")
"""The phases from a change's barrier published to its generation committed."""


async def phase_seconds(http: aiohttp.ClientSession, sidecar: Running, topic: str) -> float:
    """The seconds ``sidecar`` spent coordinating ``topic``'s changes in the phases from
    barrier to commit, as its ``sidecar_barrier_phase_seconds`` counts them so far."""
    async with http.get(f"{sidecar.ops_url}/metrics") as response:
        samples = parse_samples(await response.text())
    return sum(
        total(samples, "sidecar_barrier_phase_seconds_sum", topic=topic, phase=phase)
        for phase in BARRIER_TO_COMMIT
    )


async def expand(http: aiohttp.ClientSession, through: Running, topic: str, target: int) -> float:
    """Change ``topic`` to ``target`` partitions through ``through``'s admin API; the
    seconds from the request to its answer, the change done."""
    started = time.monotonic()
    async with http.post(
        f"{through.url}/admin/topics/{topic}/partition-count",
        json={"count": target},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        body = await response.json()
    if response.status != 200 or body.get("phase") != "done":
        raise RuntimeError(f"change of {topic} to {target}: {response.status} {body}")
    return time.monotonic() - started


async def measure_changes(
    http: aiohttp.ClientSession,
    hosts: str,
    fleet: Sequence[Running],
    topic: str,
    first_count: int,
    count: int,
) -> Changes:
    """Expand ``topic`` ``count`` times by one partition through sidecar 0's admin API."""
    before = await zookeeper_counters(hosts)
    began = time.monotonic()
    seconds, barrier_to_commit = [], []
    for target in range(first_count + 1, first_count + count + 1):
        phases_before = await phase_seconds(http, fleet[0], topic)
        seconds.append(await expand(http, fleet[0], topic, target))
        barrier_to_commit.append(await phase_seconds(http, fleet[0], topic) - phases_before)
    after = await zookeeper_counters(hosts)
    return Changes(
        len(fleet),
        seconds,
        barrier_to_commit,
        after["Received"] - before["Received"],
        time.monotonic() - began,
    )


@dataclass(frozen=True, slots=True)
class PausedChange:
    """One expansion while one sidecar of the fleet was stopped (SIGSTOP)."""

    sidecars: int
    seconds: float
    """From the admin request to its answer (phase done)."""
    session_timeout_s: float
    resumed_ready_s: float
    """From SIGCONT until the paused sidecar's ``/readyz`` answered 200 again."""


async def measure_paused_change(
    http: aiohttp.ClientSession, fleet: Sequence[Running], topic: str, target: int
) -> PausedChange:
    """Expand ``topic`` to ``target`` through sidecar 0 while the last sidecar is stopped."""
    paused = fleet[-1]
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        seconds = await expand(http, fleet[0], topic, target)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    resumed = time.monotonic()
    while True:
        if time.monotonic() - resumed > READY_WITHIN_S:
            raise RuntimeError(f"sidecar {paused.name} not ready again after its pause")
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{paused.ops_url}/readyz") as ready:
                if ready.status == 200:
                    break
        await asyncio.sleep(READY_POLL_S)
    session_timeout_s = Settings(sidecar_id="defaults").zookeeper.session_timeout_s
    return PausedChange(len(fleet), seconds, session_timeout_s, time.monotonic() - resumed)


# Start times -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    topics: int
    lanes: int
    ready_s: float
    requests: int | None
    """The new session's packets until ready (None: its connection was not told apart)."""
    rss_ready_kib: int
    rss_settled_kib: int


async def measure_start(
    cluster: ClusterEndpoints,
    root: str,
    name: str,
    topics: int,
    lanes: int,
    settle_s: float,
    log: IO[bytes],
    http: aiohttp.ClientSession,
) -> Start:
    before = await zookeeper_connections(cluster.zookeeper_hosts)
    running = await start_sidecar(cluster, root, name, lanes, log, http)
    try:
        rss_ready = rss_kib(running.pid)
        after = await zookeeper_connections(cluster.zookeeper_hosts)
        new = [count for address, count in after.items() if address not in before]
        await asyncio.sleep(settle_s)
        rss_settled = rss_kib(running.pid)
    finally:
        await stop_sidecar(running)
    return Start(
        topics,
        lanes,
        running.ready_s,
        new[0] if len(new) == 1 else None,
        rss_ready,
        rss_settled,
    )


# The run ---------------------------------------------------------------------------------


@dataclass
class Results:
    plan: Plan
    baseline: Window | None = None
    windows: list[Window] = field(default_factory=list)
    starts: list[Start] = field(default_factory=list)
    changes: list[Changes] = field(default_factory=list)
    paused_changes: list[PausedChange] = field(default_factory=list)
    skipped_starts: list[int] = field(default_factory=list)
    idle_starts_s: list[float] = field(default_factory=list)
    """Ready times of the idle fleet's sidecars (started several at once)."""


async def run(plan: Plan, log: IO[bytes]) -> tuple[Results, str]:
    suffix = uuid.uuid4().hex[:8]
    root = f"/bench-scale-{suffix}"
    idle_topics = [f"bench-scale-{suffix}-{i}" for i in range(plan.topics)]
    change_topic = f"bench-scale-{suffix}-change"
    change_topic_made = False
    change_count = 1
    filler_topics: list[str] = []
    results = Results(plan)
    counts = Path(tempfile.gettempdir()) / f"bench-scale-{suffix}-zk-calls.json"
    with provide_cluster() as cluster:
        kafka = kafka_line(cluster)
        hosts = cluster.zookeeper_hosts
        print(f"cluster: Kafka {kafka}, ZooKeeper {hosts}", flush=True)
        status = cluster.local.status() if cluster.local is not None else {}
        zookeeper_pid = (status.get("zookeeper") or {}).get("pid")
        brokers = [pid for pid in cluster_pids(cluster) if pid != zookeeper_pid]
        fleet: list[Running] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            try:
                print(f"baseline: {plan.window_s:g} s with no sidecar", flush=True)
                results.baseline = await measure_window(
                    hosts, [], 0, plan.window_s, zookeeper_pid, brokers
                )
                print(f"  {results.baseline.rate:.2f} requests/s", flush=True)
                for count in sorted(plan.sidecars):
                    started = await asyncio.gather(
                        *(
                            start_sidecar(
                                cluster,
                                root,
                                f"scale{index}",
                                plan.lanes,
                                log,
                                http,
                                counts if index == 0 else None,
                            )
                            for index in range(len(fleet), count)
                        ),
                        return_exceptions=True,
                    )
                    ready = [s for s in started if isinstance(s, Running)]
                    fleet.extend(ready)
                    failed = [s for s in started if isinstance(s, BaseException)]
                    if failed:
                        raise failed[0]
                    results.idle_starts_s.extend(s.ready_s for s in ready)
                    if idle_topics and count == sorted(plan.sidecars)[0]:
                        await create_topics(
                            http,
                            fleet[0],
                            idle_topics,
                            IDLE_PARTITIONS,
                            cluster.replication_factor,
                        )
                    print(
                        f"{count} sidecars ready, {plan.topics} topics; quiet for "
                        f"{plan.quiet_s:g} s, then a {plan.window_s:g} s window",
                        flush=True,
                    )
                    await asyncio.sleep(plan.quiet_s)
                    window = await measure_window(
                        hosts, fleet, plan.topics, plan.window_s, zookeeper_pid, brokers
                    )
                    results.windows.append(window)
                    print(f"  {summary_line(window, results.baseline)}", flush=True)
                    if plan.changes:
                        if not change_topic_made:
                            await create_topics(
                                http, fleet[0], [change_topic], 1, cluster.replication_factor
                            )
                            change_topic_made = True
                        changes = await measure_changes(
                            http, hosts, fleet, change_topic, change_count, plan.changes
                        )
                        change_count += plan.changes
                        results.changes.append(changes)
                        print(
                            f"  {plan.changes} changes: median "
                            f"{statistics.median(changes.seconds):.2f} s, "
                            f"max {max(changes.seconds):.2f} s; barrier to commit, median "
                            f"{statistics.median(changes.barrier_to_commit):.2f} s",
                            flush=True,
                        )
                        if plan.paused_change and len(fleet) > 1:
                            change_count += 1
                            paused = await measure_paused_change(
                                http, fleet, change_topic, change_count
                            )
                            results.paused_changes.append(paused)
                            print(
                                f"  a change with one sidecar paused: {paused.seconds:.2f} s "
                                f"(session timeout {paused.session_timeout_s:g} s)",
                                flush=True,
                            )
                if plan.topics_start:
                    await asyncio.gather(*(stop_sidecar(s) for s in fleet[1:]))
                    del fleet[1:]
                    topics_now = plan.topics
                    first = True
                    for target in sorted(plan.topics_start):
                        if target < topics_now:
                            results.skipped_starts.append(target)
                            continue
                        names = [f"bench-scale-{suffix}-s{i}" for i in range(topics_now, target)]
                        print(f"start time at {target} topics: creating {len(names)}", flush=True)
                        await create_topics(
                            http, fleet[0], names, START_PARTITIONS, cluster.replication_factor
                        )
                        filler_topics.extend(names)
                        topics_now = target
                        lanes = [plan.lanes] * plan.start_repeats
                        if first and plan.lanes != 3:
                            lanes.append(3)
                        first = False
                        for repeat, lane_count in enumerate(lanes):
                            start = await measure_start(
                                cluster,
                                root,
                                f"start{target}-{repeat}",
                                target,
                                lane_count,
                                plan.settle_s,
                                log,
                                http,
                            )
                            results.starts.append(start)
                            print(
                                f"  {lane_count} lane(s): ready in {start.ready_s:.2f} s, "
                                f"RSS {start.rss_ready_kib / 1024:.1f} MiB",
                                flush=True,
                            )
            finally:
                await asyncio.gather(*(stop_sidecar(s) for s in fleet), return_exceptions=True)
                changed = [change_topic] if change_topic_made else []
                await remove_data(cluster, idle_topics + filler_topics + changed, root)
                counts.unlink(missing_ok=True)
    return results, kafka


# Rendering -------------------------------------------------------------------------------


def per_sidecar(window: Window, baseline: Window | None) -> float:
    base = baseline.rate if baseline is not None else 0.0
    return (window.rate - base) / window.sidecars if window.sidecars else float("nan")


def summary_line(window: Window, baseline: Window | None) -> str:
    rss = [kib / 1024 for kib in window.rss_kib]
    return (
        f"{window.sidecars} sidecars, {window.topics} topics: ZooKeeper {window.rate:.2f} "
        f"requests/s, {per_sidecar(window, baseline):.2f} per idle sidecar (baseline "
        f"subtracted); RSS {min(rss):.1f}-{max(rss):.1f} MiB"
    )


def _mib(kib: Iterable[int]) -> str:
    values = [k / 1024 for k in kib]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def _connection_spread(window: Window) -> str:
    rates = sorted(count / window.seconds for count in window.connections.values())
    if not rates:
        return "-"
    return f"{rates[0]:.2f}-{rates[-1]:.2f} ({len(rates)})"


def idle_table(results: Results) -> list[str]:
    rows = []
    baseline = results.baseline
    for window in ([baseline] if baseline else []) + results.windows:
        counted = sum(window.counted.values()) / window.seconds if window.sidecars else 0.0
        rows.append(
            [
                str(window.sidecars),
                str(window.topics),
                f"{window.seconds:.0f} s",
                f"{window.received:,} ({window.rate:.2f}/s)",
                "-" if window is baseline else f"**{per_sidecar(window, baseline):.2f}**",
                "-" if window is baseline else _connection_spread(window),
                "-" if window is baseline else f"{counted:.2f}",
                "-" if window is baseline else _mib(window.rss_kib[:1]),
                "-" if window.sidecars < 2 else _mib(window.rss_kib[1:]),
                "-" if window is baseline else f"{window.sidecar_cpu / window.sidecars:.2f} %",
                f"{window.zookeeper_cpu:.2f} %",
                f"{window.cluster_cpu:.0f} % / {window.machine_cpu:.0f} %",
                f"{window.load[0]:.2f}",
            ]
        )
    return markdown_table(
        [
            "sidecars",
            "managed topics",
            "window",
            "ZooKeeper packets received",
            "requests/s per idle sidecar (baseline subtracted)",
            "per connection, /s (min-max, connections)",
            "sidecar 0 counted in process, /s",
            "RSS MiB, sidecar 0 (counting)",
            "RSS MiB, the others (min / median / max)",
            "CPU per sidecar (% of a core)",
            "ZooKeeper CPU",
            "brokers / whole machine CPU",
            "load average (1 min) at the end",
        ],
        rows,
    )


def calls_table(windows: Sequence[Window]) -> list[str]:
    """Sidecar 0's requests per second by kind, one column per window."""
    keys = sorted(
        {key for window in windows for key in window.counted},
        key=lambda key: -max(w.counted[key] / w.seconds for w in windows),
    )
    rows = [
        [
            f"`{operation}`",
            f"`{path}`" if path else "-",
            f"`{made_by}`",
            *(
                f"{window.counted[(operation, path, made_by)] / window.seconds:.3f}"
                for window in windows
            ),
        ]
        for operation, path, made_by in keys
    ]
    rows.append(
        [
            "**all**",
            "",
            "",
            *(f"**{sum(w.counted.values()) / w.seconds:.3f}**" for w in windows),
        ]
    )
    return markdown_table(
        [
            "request",
            "path",
            "made by",
            *(f"/s with {w.sidecars} sidecars, {w.topics} topics" for w in windows),
        ],
        rows,
    )


def start_table(starts: Sequence[Start]) -> list[str]:
    groups: dict[tuple[int, int], list[Start]] = {}
    for start in starts:
        groups.setdefault((start.topics, start.lanes), []).append(start)
    rows = []
    for (topics, lanes), group in groups.items():
        times = [s.ready_s for s in group]
        requests = [s.requests for s in group if s.requests is not None]
        rows.append(
            [
                str(topics),
                str(lanes),
                f"**{statistics.median(times):.2f}**",
                ", ".join(f"{t:.2f}" for t in times),
                ", ".join(str(r) for r in requests) if requests else "-",
                _mib(s.rss_ready_kib for s in group),
                _mib(s.rss_settled_kib for s in group),
            ]
        )
    return markdown_table(
        [
            "managed topics",
            "lanes",
            "start to /readyz 200, median s",
            "each start, s",
            "ZooKeeper packets of its session until ready",
            "RSS at ready, MiB (min / median / max)",
            "RSS after settling, MiB",
        ],
        rows,
    )


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def changes_table(changes: Sequence[Changes]) -> list[str]:
    rows = [
        [
            str(c.sidecars),
            str(len(c.seconds)),
            f"**{statistics.median(c.seconds):.2f}**",
            f"{_percentile(c.seconds, 0.99):.2f}",
            ", ".join(f"{x:.2f}" for x in c.seconds),
            f"**{statistics.median(c.barrier_to_commit):.2f}**",
            f"{_percentile(c.barrier_to_commit, 0.99):.2f}",
            f"{c.received / len(c.seconds):.0f}",
            f"{c.received / len(c.seconds) / c.sidecars:.1f}",
        ]
        for c in changes
    ]
    return markdown_table(
        [
            "sidecars",
            "changes",
            "request to done, median s",
            "p99 s",
            "each, s",
            "barrier to commit, median s",
            "p99 s",
            "ZooKeeper packets per change",
            "per change and sidecar",
        ],
        rows,
    )


def render(results: Results) -> list[str]:
    plan = results.plan
    baseline = results.baseline
    lines = [
        "## Idle ZooKeeper load per sidecar",
        "",
        f"{plan.topics} managed topic(s) ({IDLE_PARTITIONS} partitions, RF 3); each window "
        f"{plan.window_s:g} s with no traffic, after every sidecar was ready and "
        f"{plan.quiet_s:g} s of quiet. Sidecars: product defaults but "
        f"`kafka.transaction_lanes` = {plan.lanes}. The first row is the **baseline** "
        "(no sidecar running, same cluster, same run); its rate is subtracted before "
        f"dividing by the sidecars. Goal: ≤ {GOAL_PER_SIDECAR:g} request/s per idle sidecar.",
        "",
        *idle_table(results),
        "",
    ]
    verdicts = [
        f"{w.sidecars} sidecars: {per_sidecar(w, baseline):.2f}/s "
        + ("(met)" if per_sidecar(w, baseline) <= GOAL_PER_SIDECAR else "(**not met**)")
        for w in results.windows
    ]
    lines += [
        f"Goal ≤ {GOAL_PER_SIDECAR:g} request/s per idle sidecar with {plan.topics} managed "
        f"topic(s): {'; '.join(verdicts)}.",
        "",
        "ZooKeeper's `Received` counts every packet a client sent: requests and heartbeat "
        "pings. The per-connection column is `stat`'s `recved` for each connection open "
        "at both ends of the window (one per sidecar). 'Sidecar 0 counted in process' is "
        "the same sidecar's kazoo requests and pings as `bench.zk_calls` counted them. CPU "
        "is over the window, in % of one core (the machine has "
        f"{cores()} cores, so {cores() * 100} % is all of it).",
        "",
    ]
    if results.idle_starts_s:
        lines += [
            f"The idle fleet's sidecars (started together where several were added) were "
            f"ready {min(results.idle_starts_s):.1f}-{max(results.idle_starts_s):.1f} s "
            "after their processes started.",
            "",
        ]
    if results.windows:
        lines += [
            "## Where an idle sidecar's ZooKeeper requests come from",
            "",
            "Sidecar 0's requests in each window, counted in its process by "
            "`bench.zk_calls` (`BENCH_ZK_CALLS_FILE`): kazoo's request type, the path "
            "(`<root>` the deployment's root, `*` a name, `#` a number) and the sidecar "
            "code that made it (the coroutines above the ZooKeeper adapter > the adapter "
            "function).",
            "",
            *calls_table(results.windows),
            "",
        ]
    if results.changes:
        lines += [
            "## A change's time against sidecars",
            "",
            f"After each idle window, {plan.changes} expansions of one topic (by one "
            "partition each, RF 3), one after the other, through sidecar 0's admin API: "
            "from the request to its answer (the change done: partitions created, barrier "
            "published, every live sidecar's ack, commit), and the part of it from the "
            "barrier published to the generation committed (the coordinator's "
            "`sidecar_barrier_phase_seconds` of the barrier, fencing, reading_boundaries "
            "and committing phases; goal ≤ 2 s with 100 sidecars). ZooKeeper packets are "
            "every client's during the changes, pings included.",
            "",
            *changes_table(results.changes),
            "",
        ]
    if results.paused_changes:
        lines += [
            "### A change with one sidecar paused",
            "",
            "One more expansion after each count's changes, with the fleet's last sidecar "
            "stopped (SIGSTOP) from before the request until its answer: the barrier waits "
            "for that sidecar's ack until ZooKeeper expires its session. 'Ready again' is "
            "from SIGCONT until its `/readyz` answered 200 (a new session, its topics read "
            "again).",
            "",
            *markdown_table(
                ["sidecars", "request to done, s", "session timeout, s", "ready again, s"],
                [
                    [
                        str(p.sidecars),
                        f"**{p.seconds:.2f}**",
                        f"{p.session_timeout_s:g}",
                        f"{p.resumed_ready_s:.2f}",
                    ]
                    for p in results.paused_changes
                ],
            ),
            "",
        ]
    if results.starts:
        lines += [
            "## Start time against managed topics",
            "",
            f"One more `sidecar serve` beside sidecar 0 (idle), started "
            f"{plan.start_repeats} times per topic count (and once with 3 lanes at the "
            "first count): from starting the process to `/readyz` 200 (polled every "
            f"{READY_POLL_S * 1000:.0f} ms). Topics added for this part have "
            f"{START_PARTITIONS} partition, RF 3. 'After settling' is {plan.settle_s:g} s "
            "after ready (its first housekeeping round has run).",
            "",
            *start_table(results.starts),
            "",
        ]
    if results.skipped_starts:
        lines += [
            f"Not measured: start at {results.skipped_starts} topics (fewer than the "
            f"{plan.topics} already managed).",
            "",
        ]
    lines += ["## How it was measured", "", *(__doc__ or "").split("\n\n", 1)[1].splitlines()]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--sidecars", type=int, nargs="+", default=[1, 3, 10], help="sidecar counts (1 3 10)"
    )
    parser.add_argument("--topics", type=int, default=1, help="managed topics while idle (1)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds sampled (60)")
    parser.add_argument(
        "--quiet", type=float, default=30.0, help="seconds after ready before sampling (30)"
    )
    parser.add_argument(
        "--topics-start",
        type=int,
        nargs="*",
        default=[1, 100],
        help="managed topic counts for the start time (1 100; none: skip)",
    )
    parser.add_argument("--start-repeats", type=int, default=2, help="starts per count (2)")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds after ready for the second RSS (3)"
    )
    parser.add_argument("--lanes", type=int, default=1, help="kafka.transaction_lanes (1)")
    parser.add_argument(
        "--changes",
        type=int,
        default=5,
        help="partition-count changes timed after each idle window (5; 0: none)",
    )
    parser.add_argument(
        "--paused-change",
        action="store_true",
        help="after each count's changes, one more with the last sidecar paused",
    )
    parser.add_argument(
        "--report", type=Path, default=RESULTS_DIR / "scale.md", help="where the report goes"
    )
    args = parser.parse_args(argv)
    if min(args.sidecars) < 1 or args.topics < 0:
        parser.error("--sidecars must be at least 1 and --topics at least 0")
    plan = Plan(
        sidecars=tuple(sorted(set(args.sidecars))),
        topics=args.topics,
        window_s=args.window,
        quiet_s=args.quiet,
        topics_start=tuple(sorted(set(args.topics_start))),
        start_repeats=args.start_repeats,
        settle_s=args.settle,
        lanes=args.lanes,
        changes=args.changes,
        paused_change=args.paused_change,
    )
    measure_and_write(
        "scale",
        "Scale benchmark: idle ZooKeeper load per sidecar, start time against topics",
        lambda log: run(plan, log),
        render,
        path=args.report,
    )


if __name__ == "__main__":
    main()
