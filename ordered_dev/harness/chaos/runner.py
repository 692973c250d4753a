"""The cluster side of a chaos run: sidecar processes, load, changes, faults, final reads.

``ChaosRun(config, cluster).run()`` needs a ``LocalCluster`` (it kills brokers and pauses
ZooKeeper) and returns a ``ChaosOutcome`` with the history, the topics as stored and
the check results. Everything it starts it stops, and every fault is undone by the
time it returns (a paused process is resumed, a killed broker restarted), also when it
fails.

The setup (DESIGN §5-§7 exercised together):

* ``config.sidecars`` ``sidecar serve`` processes on one fresh ZooKeeper root, so that
  SIGKILL and SIGSTOP are real;
* two managed topics: one with ``cleanup.policy=delete``, one compacted with compaction
  forced (small ``segment.ms`` and ``segment.bytes``, low ``min.cleanable.dirty.ratio``);
* ``config.producers`` producers, each bound to one sidecar and one topic, sending one
  request at a time of one record per key, each record's value naming (producer, key,
  sequence);
* two consumer groups subscribed to both topics, one instance per sidecar each: one in
  callback mode with auto-commit (each instance's callback endpoint is a loopback HTTP
  server of the harness, which records keys_revoked / keys_assigned and answers 204, or
  503 during a callback-refusal fault), one in events mode that acknowledges every event
  and commits after every poll;
* a change loop (``plan.Plan.changes``) and a fault loop (``plan.Plan.faults``), a
  prober sending produces that name an older generation, and a sampler of the change
  lock's nodes in ZooKeeper.

After the load phase and the last fault, one more change of each topic is made under
load (it must be done: nothing may stay blocked), then the producers stop; the run waits
for every acknowledged record to reach both groups (acknowledged records of the
compacted topic that compaction removed meanwhile excepted), the groups stop, the
compacted topic's segments are rolled and the run waits for the log cleaner; then both
topics are read with ``read_committed`` and the checks run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from prometheus_client.parser import text_string_to_metric_families

from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.chaos.checks import (
    ROLL_HEADER,
    CheckResult,
    RunTimes,
    StoredRecord,
    TopicSnapshot,
    compacted_away,
    parse_value,
    run_checks,
)
from ordered_dev.harness.chaos.history import (
    Acked,
    ChangeRecord,
    FaultRecord,
    History,
    Incarnation,
    KeptLog,
    LockSighting,
    Trim,
)
from ordered_dev.harness.chaos.plan import ChangeVia, ChaosConfig, FaultKind, Plan, PlannedFault
from ordered_dev.harness.sidecars import (
    ADMIN_TOKEN,
    SidecarProcess,
    log_of_description,
    settings_for,
    start_process,
    stop_process,
)
from sidecar.config import KafkaSettings, Settings
from sidecar.core.compaction import GroupHandoff, foldable_count
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.handoff import revocation_points
from sidecar.core.placement import routed_generation

CONSUMER_JSON = "application/vnd.kafka.v2+json"
POLL_TIMEOUT_MS = 1000
REQUEST_LIMIT_S = 120.0
"""No harness request waits longer (a paused sidecar answers when resumed)."""
READ_TRIES = 5
BURST_REQUESTS = 30
BURST_LEAD_S = 0.02
"""How long after the burst's requests go out the sidecar is stopped."""
BURST_PRODUCER = 100
"""Producer numbers of the bursts (100 + the number of faults before)."""
SETTLE_S = 5.0
REBALANCE_COUNTERS = ("sidecar_consumer_rebalances", "sidecar_consumer_rebalance_requests")
"""Metric families of the rebalances an instance went through, and those a sidecar asked."""
"""How long the groups keep polling after full delivery and the last change, so that
hand-off events of that change reach them."""


class ConnectionLost(Exception):
    """The sidecar a request went to is gone (killed)."""


@dataclass
class GroupSpec:
    name: str
    callback: bool

    @property
    def mode(self) -> str:
        return "callback, auto-commit" if self.callback else "events, commit after every poll"


@dataclass
class ChaosOutcome:
    config: ChaosConfig
    history: History
    topics: list[str]
    groups: list[GroupSpec]
    snapshots: list[TopicSnapshot]
    checks: list[CheckResult]
    times: RunTimes
    load_s: float = 0.0
    elapsed_s: float = 0.0
    sidecar_logs: list[str] = field(default_factory=list)
    settings_note: str = ""
    rebalances: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per group: rebalances its instances went through (partitions assigned, summed
    over instances) and rebalances the sidecars asked of it, as last scraped from every
    sidecar process (a killed one's count up to its last scrape)."""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


class SidecarSlot:
    """The sidecar process at one position; a killed one is replaced by a new process
    (a new id and port) at the same position."""

    def __init__(self, index: int, make_settings: Callable[[str], Settings]) -> None:
        self.index = index
        self._make_settings = make_settings
        self.restarts = 0
        self.process: SidecarProcess | None = None
        self.retired: list[SidecarProcess] = []
        self.up = asyncio.Event()
        self.paused = False
        self.log_paths: list[str] = []

    @property
    def running(self) -> bool:
        return self.up.is_set() and not self.paused

    @property
    def id(self) -> str:
        return self.process.id if self.process is not None else f"slot{self.index}(down)"

    async def start(self) -> None:
        settings = self._make_settings(f"chaos{self.index}-{self.restarts}")
        log_path = Path(_log_dir()) / f"ordered-sidecar-{settings.sidecar_id}.log"
        self.log_paths.append(str(log_path))
        try:
            self.process = await start_process(settings)
        except (AssertionError, TimeoutError) as exc:
            tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
            raise RuntimeError(
                f"sidecar {settings.sidecar_id} did not start: {exc}\n{tail}"
            ) from exc
        self.up.set()

    async def client(self) -> SidecarProcess:
        await self.up.wait()
        assert self.process is not None
        return self.process

    async def kill(self) -> str:
        self.up.clear()
        assert self.process is not None
        old = self.process
        old.process.kill()
        await old.process.wait()
        self.retired.append(old)
        self.process = None
        self.restarts += 1
        return old.id

    def pause(self) -> None:
        assert self.process is not None
        self.paused = True
        os.kill(self.process.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.paused and self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.process.pid, signal.SIGCONT)
        self.paused = False

    async def stop(self) -> None:
        self.resume()
        if self.process is not None:
            await stop_process(self.process)
        for old in self.retired:
            await old.http.close()


def _log_dir() -> str:
    return tempfile.gettempdir()


class ChaosRun:
    def __init__(
        self,
        config: ChaosConfig,
        cluster: ClusterEndpoints,
        *,
        say: Callable[[str], None] = print,
        remove_data: bool = False,
    ) -> None:
        if cluster.local is None:
            raise ValueError("a chaos run needs a LocalCluster: it kills brokers, pauses ZooKeeper")
        self.config = config
        self.cluster = cluster
        self.local: LocalCluster = cluster.local
        self.plan = Plan(config)
        self.remove_data = remove_data
        """Delete the topics and the ZooKeeper root at the end (a shared cluster)."""
        self._say = say
        suffix = uuid.uuid4().hex[:6]
        self.root = f"/chaos-{suffix}"
        self.topics = [f"chaos-delete-{suffix}", f"chaos-compacted-{suffix}"]
        self.groups = [
            GroupSpec(f"chaos-cb-{suffix}", True),
            GroupSpec(f"chaos-ev-{suffix}", False),
        ]
        self.history = History(groups=tuple(g.name for g in self.groups))
        self.slots = [SidecarSlot(i, self._settings) for i in range(config.sidecars)]
        self.counts = {topic: config.initial_count for topic in self.topics}
        self.changing: set[str] = set()
        """Topics with a change running."""
        self.fault_changes: list[asyncio.Task[str]] = []
        self._rebalance_samples: dict[tuple[str, str, str], int] = {}
        """(sidecar id, counter, group) -> the counter's last scraped value."""
        self.generation_seen = {topic: 0 for topic in self.topics}
        for topic in self.topics:
            self.history.kept_logs[topic] = KeptLog(config.initial_count)
        self.trimmed: dict[str, list[StoredRecord]] = {topic: [] for topic in self.topics}
        """Records the harness read and then deleted (``_trim_loop``), for the checks."""
        self.trimmed_to: dict[int, int] = {}
        """Per partition of the delete topic, where the last trim left its log start."""
        self.stop_producing = asyncio.Event()
        self.stop_consuming = asyncio.Event()
        self.load_over = asyncio.Event()
        self.refusing_callbacks = False
        self.incarnations: dict[str, Incarnation] = {}
        self.active: dict[tuple[str, int], Incarnation] = {}
        self.recreate: dict[tuple[str, int], asyncio.Event] = {}
        self.recreated: dict[tuple[str, int], asyncio.Event] = {}
        self._callback_runners: list[web.AppRunner] = []
        self.callback_urls: list[str] = []
        self._zookeeper_paused = False
        self._broker_down: int | None = None
        self._rng = random.Random(f"{config.seed}/harness")

    def say(self, text: str) -> None:
        self._say(f"[{self.history.now():7.1f} s] {text}")

    def _settings(self, name: str) -> Settings:
        config = self.config
        settings = settings_for(
            self.cluster,
            self.root,
            name,
            session_timeout_s=config.session_timeout_s,
            hold_timeout_s=config.hold_timeout_s,
            barrier_timeout_s=config.barrier_timeout_s,
            request_timeout_ms=config.request_timeout_ms,
            transaction_lanes=config.transaction_lanes,
        )
        if config.compaction_interval_s is None:
            return settings
        changes = replace(settings.changes, compaction_interval_s=config.compaction_interval_s)
        return replace(settings, changes=changes)

    # The run ----------------------------------------------------------------------------

    async def run(self) -> ChaosOutcome:
        tasks: list[asyncio.Task[Any]] = []
        try:
            await asyncio.gather(*(slot.start() for slot in self.slots))
            self.say(f"sidecars {[s.id for s in self.slots]} on root {self.root}")
            await self._create_topics()
            await self._start_callback_endpoints()
            consumers = [
                self._task(self._consume(group, index), f"consumer {group.name}/c{index}")
                for group in self.groups
                for index in range(self.config.sidecars)
            ]
            producers = [
                self._task(self._produce(index), f"producer {index}")
                for index in range(self.config.producers)
            ]
            stale = self._task(self._stale_probes(), "stale probes")
            locks = self._task(self._watch_locks(), "lock sampler")
            commits = self._task(self._watch_commits(), "commit sampler")
            rebalances = self._task(self._watch_rebalances(), "rebalance sampler")
            logs = self._task(self._watch_logs(), "log sampler")
            tasks = [*consumers, *producers, stale, locks, commits, rebalances, logs]
            if self.config.trim_every_s > 0:
                tasks.append(self._task(self._trim_loop(), "trimmer"))
            load_began = self.history.now()
            changes = asyncio.create_task(self._change_loop())
            tasks.append(changes)
            await self._fault_loop()
            if self.config.load_s is not None:
                await asyncio.sleep(max(0.0, load_began + self.config.load_s - self.history.now()))
            self.load_over.set()
            self.say("load phase over: the last change finishes, then the producers stop")
            await changes
            await asyncio.gather(*self.fault_changes)
            last_fault_end = max((f.ended for f in self.history.faults), default=self.history.now())
            # Under load still, so that records land in partitions the last change made
            # (a partition brought back from retirement among them).
            await self._final_changes()
            await asyncio.sleep(1.0)
            load_s = self.history.now() - load_began
            self.stop_producing.set()
            await asyncio.gather(*producers, stale)
            stopped = self.history.now()
            evidence = await self._drain(max(last_fault_end, stopped))
            await asyncio.sleep(SETTLE_S)
            self.stop_consuming.set()
            await asyncio.gather(*consumers)
            snapshots = await self._snapshots()
            for watcher in (locks, commits, rebalances, logs):
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            times = RunTimes(last_fault_end, stopped, evidence)
            checks = run_checks(
                self.history,
                snapshots,
                times,
                liveness_bound_s=self.config.liveness_bound_s,
                lock_leak_s=self.config.lock_leak_s,
            )
            return ChaosOutcome(
                self.config,
                self.history,
                self.topics,
                self.groups,
                snapshots,
                checks,
                times,
                load_s=load_s,
                elapsed_s=self.history.now(),
                sidecar_logs=[p for s in self.slots for p in s.log_paths],
                settings_note=self._settings_note(),
                rebalances=self._rebalance_totals(),
            )
        finally:
            self.stop_producing.set()
            self.stop_consuming.set()
            self.load_over.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._undo_faults()
            await asyncio.gather(*(slot.stop() for slot in self.slots), return_exceptions=True)
            for runner in self._callback_runners:
                await runner.cleanup()
            if self.remove_data:
                await _remove_data(self.cluster, self.topics, self.root)

    def _task(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task whose failure is said at once (and raised again when it is awaited)."""

        def report(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None:
                self.say(f"{name} failed: {task.exception()!r}")

        task = asyncio.create_task(work)
        task.add_done_callback(report)
        return task

    def _settings_note(self) -> str:
        c = self.config
        return (
            f"zookeeper.session_timeout_s = {c.session_timeout_s:g}, kafka.request_timeout_ms = "
            f"{c.request_timeout_ms}, produce.barrier_timeout_s = {c.barrier_timeout_s:g}, "
            f"produce.hold_timeout_s = {c.hold_timeout_s:g}, kafka.transaction_lanes = "
            f"{c.transaction_lanes or KafkaSettings().transaction_lanes}, "
            "changes.compaction_interval_s = "
            f"{self._settings('note').changes.compaction_interval_s:g}"
        )

    async def _undo_faults(self) -> None:
        """Whatever a fault left behind is undone: ZooKeeper and sidecars resumed, the
        broker restarted."""
        if self._zookeeper_paused:
            self._signal_zookeeper(signal.SIGCONT)
        for slot in self.slots:
            slot.resume()
        if self._broker_down is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.local.start_broker, self._broker_down, 120.0)
            self._broker_down = None

    async def _create_topics(self) -> None:
        client = await self.slots[0].client()
        config = self.config
        delete, compacted = self.topics
        await client.create_topic(
            delete, config.initial_count, replication_factor=self.cluster.replication_factor
        )
        await client.create_topic(
            compacted,
            config.initial_count,
            replication_factor=self.cluster.replication_factor,
            compacted=True,
            configs={
                "segment.ms": str(config.segment_ms),
                "segment.bytes": str(config.segment_bytes),
                "min.cleanable.dirty.ratio": str(config.min_cleanable_dirty_ratio),
            },
        )

    # Producing ----------------------------------------------------------------------------

    async def _produce(self, index: int) -> None:
        slot = self.slots[index % len(self.slots)]
        topic = self.topics[index % len(self.topics)]
        keys = [f"p{index}-k{k}" for k in range(self.config.keys_per_producer)]
        sequence = 0
        while not self.stop_producing.is_set():
            client = await self._running_or_stop(slot, self.stop_producing, paused_ok=True)
            if client is None:
                return
            records = [
                {"key": key, "value": {"producer": index, "key": key, "seq": sequence}}
                for key in keys
            ]
            self.history.produce_requests += 1
            try:
                status, body = await _bounded(_produce(client, topic, records))
            except (ConnectionLost, TimeoutError) as exc:
                self.history.produce_refused[type(exc).__name__] += 1
                sequence += 1
                await asyncio.sleep(0.5)
                continue
            if status == 200:
                generation = int(body["generation"])
                self.generation_seen[topic] = max(self.generation_seen[topic], generation)
                for key, entry in zip(keys, body["offsets"], strict=True):
                    if entry["error_code"] is not None:
                        self.history.produce_refused[f"record {entry['error_code']}"] += 1
                        continue
                    self.history.ack(
                        Acked(
                            (index, key, sequence),
                            topic,
                            int(entry["partition"]),
                            int(entry["offset"]),
                            generation,
                            client.id,
                            self.history.now(),
                        )
                    )
            else:
                self.history.produce_refused[f"{status} {body.get('error_code')}"] += 1
            sequence += 1
            await asyncio.sleep(self.config.produce_pause_s)

    async def _stale_probes(self) -> None:
        """Produces naming the generation before the newest one seen: all must be fenced."""
        number = 0
        while not self.stop_producing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_producing.wait(), self.config.stale_probe_every_s)
                return
            topic = self._rng.choice(self.topics)
            known = self.generation_seen[topic]
            running = [s for s in self.slots if s.running]
            if known < 1 or not running:
                continue
            client = await self._rng.choice(running).client()
            number += 1
            record = {"key": f"stale-{number}", "value": {"stale": number}}
            try:
                status, body = await _bounded(
                    _produce(client, topic, [record], {"expected_generation": known - 1})
                )
            except (ConnectionLost, TimeoutError) as exc:
                self.history.stale_probes[type(exc).__name__] += 1
                continue
            code = body.get("error_code")
            if (status, code) == (409, 40910):
                self.history.stale_probes["fenced"] += 1
            elif status == 200:
                self.history.stale_probes["accepted"] += 1
                self.history.stale_accepted.append(
                    f"{topic}: expected_generation {known - 1} (generation {known} seen) via "
                    f"{client.id}: {json.dumps(body)[:300]}"
                )
            else:
                self.history.stale_probes[f"{status} {code}"] += 1

    # Consuming ----------------------------------------------------------------------------

    async def _start_callback_endpoints(self) -> None:
        for index in range(self.config.sidecars):
            app = web.Application()
            app.router.add_post("/handoff/{incarnation}", self._callback)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self._callback_runners.append(runner)
            port = runner.addresses[0][1]
            self.callback_urls.append(f"http://127.0.0.1:{port}/handoff")
            del index

    async def _callback(self, request: web.Request) -> web.Response:
        body = await request.json()
        kind = str(body.get("type"))
        if self.refusing_callbacks:
            self.history.refused_callbacks[kind] += 1
            return web.json_response(
                {"error_code": 50301, "message": "the app is refusing callbacks"}, status=503
            )
        incarnation = self.incarnations.get(request.match_info["incarnation"])
        if incarnation is not None and kind in ("keys_revoked", "keys_assigned"):
            self.history.handoff(
                incarnation,
                kind,
                str(body["topic"]),
                int(body["partition"]),
                int(body["generation"]),
                "callback",
            )
        return web.Response(status=204)

    async def _consume(self, group: GroupSpec, index: int) -> None:
        slot = self.slots[index]
        name = f"c{index}"
        self.recreate[(group.name, index)] = asyncio.Event()
        self.recreated[(group.name, index)] = asyncio.Event()
        while not self.stop_consuming.is_set():
            client = await self._running_or_stop(slot, self.stop_consuming, paused_ok=True)
            if client is None:
                return
            incarnation = self.history.new_incarnation(group.name, name, client.id)
            self.incarnations[incarnation.id] = incarnation
            self.active[(group.name, index)] = incarnation
            config: dict[str, object] = {
                "name": name,
                "format": "binary",
                "auto.offset.reset": "earliest",
                "consumer.request.timeout.ms": POLL_TIMEOUT_MS,
                "auto.commit.enable": "true" if group.callback else "false",
                # The stamp tells which generation routed each delivered record (the
                # barrier check); responses carry it only when asked.
                "record_headers": "all",
            }
            if group.callback:
                config["callback_url"] = f"{self.callback_urls[index]}/{incarnation.id}"
            try:
                created = await self._create_instance(client, group.name, name, config)
            except (ConnectionLost, TimeoutError):
                created = False
            if not created:
                self.history.end_incarnation(incarnation, "could not be created")
                await asyncio.sleep(0.5)
                continue
            self.recreated[(group.name, index)].set()
            why = await self._poll_loop(client, group, index, incarnation)
            self.history.end_incarnation(incarnation, why)

    async def _create_instance(
        self, client: SidecarProcess, group: str, name: str, config: dict[str, object]
    ) -> bool:
        status, body = await _bounded(_call(client, "POST", f"/consumers/{group}", config))
        if status == 409:
            # Left from an earlier incarnation on the same sidecar: delete it first.
            await _bounded(_call(client, "DELETE", f"/consumers/{group}/instances/{name}"))
            status, body = await _bounded(_call(client, "POST", f"/consumers/{group}", config))
        if status != 200:
            self.history.poll_errors[f"create {status} {body}"[:120]] += 1
            return False
        status, body = await _bounded(
            _call(
                client,
                "POST",
                f"/consumers/{group}/instances/{name}/subscription",
                {"topics": self.topics},
            )
        )
        if status != 204:
            self.history.poll_errors[f"subscribe {status} {body}"[:120]] += 1
            return False
        return True

    async def _poll_loop(
        self, client: SidecarProcess, group: GroupSpec, index: int, incarnation: Incarnation
    ) -> str:
        path = f"/consumers/{group.name}/instances/{incarnation.name}"
        recreate = self.recreate[(group.name, index)]
        acked_events: set[int] = set()
        told_events: set[int] = set()
        while True:
            if self.stop_consuming.is_set():
                with contextlib.suppress(ConnectionLost, TimeoutError):
                    await _bounded(_call(client, "DELETE", path), limit=20.0)
                return "run ended"
            if recreate.is_set():
                recreate.clear()
                with contextlib.suppress(ConnectionLost, TimeoutError):
                    await _bounded(_call(client, "DELETE", path))
                return "deleted (fault)"
            try:
                status, body = await _bounded(
                    _call(
                        client, "GET", f"{path}/records", params={"timeout": str(POLL_TIMEOUT_MS)}
                    )
                )
            except ConnectionLost:
                return "its sidecar went away"
            except TimeoutError:
                self.history.poll_errors["poll timed out"] += 1
                continue
            if status == 404:
                return "instance unknown to its sidecar"
            if status != 200:
                self.history.poll_errors[f"{status} {(body or {}).get('error_code')}"] += 1
                await asyncio.sleep(0.2)
                continue
            # The app has the events of this response from here on: that is when it was
            # told, not when its acknowledgement is answered (a loaded machine answers it
            # after the gate it opened has released another instance's records).
            received = (self.history.next_order(), self.history.now())
            events = [item for item in body if "type" in item]
            records = [item for item in body if "type" not in item]
            for record in records:
                self._deliver(incarnation, record)
            if group.callback:
                continue
            # Told when the response arrives, acknowledged or not: an acknowledgement
            # whose answer is lost (its sidecar killed) may still have been recorded.
            for event in events:
                if "event_id" in event and event["event_id"] not in told_events:
                    told_events.add(event["event_id"])
                    self.history.handoff(
                        incarnation,
                        str(event["type"]),
                        str(event["topic"]),
                        int(event["partition"]),
                        int(event["generation"]),
                        "event",
                        received=received,
                    )
            fresh = [e for e in events if "event_id" in e and e["event_id"] not in acked_events]
            if fresh:
                try:
                    status, answer = await _bounded(
                        _call(
                            client,
                            "POST",
                            f"{path}/events/ack",
                            {"event_ids": [e["event_id"] for e in fresh]},
                        )
                    )
                except (ConnectionLost, TimeoutError):
                    continue
                if status == 204:
                    acked_events.update(e["event_id"] for e in fresh)
                else:
                    code = (answer or {}).get("error_code")
                    self.history.commit_refusals[f"ack {status} {code}"] += 1
            if records or events:
                try:
                    status, answer = await _bounded(_call(client, "POST", f"{path}/offsets"))
                except (ConnectionLost, TimeoutError):
                    continue
                if status != 204:
                    self.history.commit_refusals[
                        f"{status} {(answer or {}).get('error_code')}"
                    ] += 1

    def _deliver(self, incarnation: Incarnation, record: dict[str, Any]) -> None:
        value = None if record["value"] is None else base64.b64decode(record["value"])
        ident = parse_value(value)
        header_generation = routed_generation(
            [
                (
                    header["name"],
                    None if header["value"] is None else base64.b64decode(header["value"]),
                )
                for header in record.get("headers") or []
            ]
        )
        if isinstance(ident, int):
            self.history.deliver(
                incarnation,
                record["topic"],
                record["partition"],
                record["offset"],
                None,
                header_generation,
            )
            return
        if ident is None:
            self.history.notes.append(
                f"{incarnation.id} got a record that is no producer's: "
                f"{record['topic']}[{record['partition']}]@{record['offset']}"
            )
            return
        self.history.deliver(
            incarnation,
            record["topic"],
            int(record["partition"]),
            int(record["offset"]),
            ident,
            header_generation,
        )

    async def _running_or_stop(
        self, slot: SidecarSlot, stop: asyncio.Event, *, paused_ok: bool = False
    ) -> SidecarProcess | None:
        """The slot's process once it is up (a paused one counts only with ``paused_ok``:
        requests to it then wait, as an app's would); None once ``stop`` is set."""
        while not stop.is_set():
            if slot.up.is_set() and (paused_ok or not slot.paused):
                return await slot.client()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
        return None

    # Changes ------------------------------------------------------------------------------

    async def _change_loop(self) -> None:
        """Start the planned changes on schedule; the two topics change side by side, a
        topic whose previous change still runs skips its turn."""
        running: set[asyncio.Task[str]] = set()
        try:
            for planned in self.plan.changes():
                try:
                    await asyncio.wait_for(self.load_over.wait(), planned.delay_s)
                    break
                except TimeoutError:
                    pass
                topic = self.topics[planned.topic]
                task = self._start_change(topic, planned.target, planned.coordinator, planned.via)
                if task is not None:
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            await asyncio.gather(*running, return_exceptions=True)

    def _start_change(
        self, topic: str, target: int, first: int, via: ChangeVia
    ) -> asyncio.Task[str] | None:
        if topic in self.changing:
            self.history.changes.append(
                ChangeRecord(
                    self.history.now(),
                    topic,
                    "-",
                    via.value,
                    self.counts[topic],
                    target,
                    "skipped: a change of the topic is running",
                    0.0,
                )
            )
            return None
        self.changing.add(topic)
        task = asyncio.create_task(self._change(topic, target, first, via))
        task.add_done_callback(lambda _: self.changing.discard(topic))
        return task

    def _coordinator(self, first: int) -> SidecarSlot | None:
        for step in range(len(self.slots)):
            slot = self.slots[(first + step) % len(self.slots)]
            if slot.running:
                return slot
        return None

    async def _change(
        self, topic: str, target: int, first: int, via: ChangeVia, *, final: bool = False
    ) -> str:
        # A change answered with an error may have been finished by another sidecar.
        await self._refresh_count(topic)
        current = self.counts[topic]
        at = self.history.now()
        slot = self._coordinator(first)
        if target == current or slot is None:
            outcome = "skipped" if target == current else "no sidecar running"
            self.history.changes.append(
                ChangeRecord(at, topic, "-", via.value, current, target, outcome, 0.0, final)
            )
            return outcome
        client = await slot.client()
        try:
            if via is ChangeVia.HTTP:
                outcome = await self._change_http(client, topic, target)
            else:
                outcome = await self._change_cli(client, topic, target, current)
        except (ConnectionLost, TimeoutError) as exc:
            outcome = type(exc).__name__
        seconds = self.history.now() - at
        count_after = await self._refresh_count(topic)
        self.history.changes.append(
            ChangeRecord(
                at,
                topic,
                client.id,
                via.value,
                current,
                target,
                outcome,
                seconds,
                final,
                count_after,
            )
        )
        self.say(
            f"{'final ' if final else ''}change {topic} {current} -> {target} via {client.id} "
            f"({via.value}): {outcome} in {seconds:.1f} s; count now {count_after}"
        )
        return outcome

    async def _change_http(self, client: SidecarProcess, topic: str, target: int) -> str:
        status, body = await _bounded(
            _admin(client, "POST", f"/admin/topics/{topic}/partition-count", {"count": target})
        )
        if status == 200:
            return str(body["phase"])
        return _refusal(status, body)

    async def _change_cli(
        self, client: SidecarProcess, topic: str, target: int, current: int
    ) -> str:
        command = "expand" if target > current else "shrink"
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("sidecar")),
            "topics",
            "--url",
            client.url,
            "--token",
            ADMIN_TOKEN,
            command,
            topic,
            "--to",
            str(target),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), REQUEST_LIMIT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        text = out.decode(errors="replace")
        if process.returncode == 0:
            return "done" if "(done)" in text else f"cli: {text.strip()[-80:]}"
        start = text.find("{")
        if start >= 0:
            with contextlib.suppress(ValueError, TypeError):
                body = json.loads(text[start:])
                return _refusal(int(body["error_code"]) // 100, body)
        output = (text + err.decode(errors="replace")).strip()[-120:]
        return f"cli exit {process.returncode}: {output}"

    async def _refresh_count(self, topic: str) -> int | None:
        """The topic's count as a running sidecar describes it (None if none answers)."""
        for slot in self.slots:
            if not slot.running:
                continue
            client = await slot.client()
            with contextlib.suppress(ConnectionLost, TimeoutError, KeyError):
                status, body = await _bounded(_admin(client, "GET", f"/admin/topics/{topic}"), 10.0)
                if status == 200:
                    self._keep_log(topic, body)
                    self.counts[topic] = int(body["undeleted_count"])
                    return self.counts[topic]
        return None

    async def _final_changes(self) -> None:
        """One more change of each topic once the faults are over: it must be done, or
        something (a leaked lock, a stuck journal) blocks every change. Retried (a
        rolled-back change is retriable) until ``final_change_within_s``; only the last
        attempt is kept in the history, with the time of all of them."""
        await asyncio.gather(*(self._final_change(topic) for topic in self.topics))

    async def _final_change(self, topic: str) -> None:
        await self._refresh_count(topic)
        current = self.counts[topic]
        target = current + 1 if current < self.config.largest_count else current - 1
        began = self.history.now()
        attempts = 0
        while True:
            attempts += 1
            await self._change(
                topic, target, self._rng.randrange(len(self.slots)), ChangeVia.HTTP, final=True
            )
            index = max(
                i for i, c in enumerate(self.history.changes) if c.final and c.topic == topic
            )
            last = self.history.changes.pop(index)
            took = self.history.now() - began
            if last.outcome == "done" or took >= self.config.final_change_within_s:
                outcome = last.outcome
                if outcome != "done":
                    outcome = f"not done within {took:.0f} s ({attempts} tries, last: {outcome})"
                self.history.changes.append(
                    replace(last, at=began, seconds=took, outcome=outcome, from_count=current)
                )
                return
            await asyncio.sleep(1.0)
            # A change resumed after the faults may have reached the target meanwhile
            # (the next ask is then refused, 422): ask for a change from where it is.
            now = await self._refresh_count(topic)
            if now is not None and now == target:
                target = now + 1 if now < self.config.largest_count else now - 1

    # Faults -------------------------------------------------------------------------------

    async def _fault_loop(self) -> None:
        load_s = self.config.load_s
        for planned in self.plan.faults():
            if load_s is not None and self.history.now() >= load_s:
                return
            await asyncio.sleep(planned.gap_s)
            if load_s is not None and self.history.now() >= load_s:
                return
            self.say(f"fault: {planned.describe(self.config.sidecars)}")
            began = self.history.now()
            target, detail = await self._inject(planned)
            record = FaultRecord(planned.kind.value, target, began, self.history.now(), detail)
            self.history.faults.append(record)
            self.say(f"fault over: {planned.kind} {target} ({record.ended - began:.1f} s) {detail}")

    async def _inject(self, planned: PlannedFault) -> tuple[str, str]:
        match planned.kind:
            case FaultKind.SIDECAR_KILL:
                slot = self.slots[planned.target]
                for (_, index), incarnation in self.active.items():
                    if index == slot.index:
                        self.history.end_incarnation(incarnation, "its sidecar was killed")
                old = await slot.kill()
                await asyncio.sleep(planned.duration_s)
                await slot.start()
                return f"sidecar {slot.index}", f"{old} killed, {slot.id} started"
            case FaultKind.SIDECAR_PAUSE:
                slot = self.slots[planned.target]
                paused = slot.id
                # Stopped while it holds admitted and in-flight requests (issue 16): a
                # burst of concurrent produces, then SIGSTOP while the sidecar works on it;
                # a second burst while it is stopped waits in its socket for the resume.
                burst = self._burst(slot, 0)
                await asyncio.sleep(BURST_LEAD_S)
                slot.pause()
                try:
                    await asyncio.sleep(1.0)
                    self._fault_change(planned)
                    await asyncio.sleep(1.0)
                    second = self._burst(slot, BURST_REQUESTS)
                    await asyncio.sleep(planned.duration_s - 2.0)
                finally:
                    slot.resume()
                paused_at = self.history.now() - planned.duration_s
                committed = [
                    c
                    for c in self.history.changes
                    if c.outcome == "done" and c.at + c.seconds >= paused_at
                ]
                sent_before, sent_during = await burst, await second
                return f"sidecar {slot.index}", (
                    f"{paused} paused {planned.duration_s:.1f} s; changes done meanwhile: "
                    f"{len(committed)}; {BURST_REQUESTS} produces sent just before: "
                    f"{_tally(sent_before)}; {BURST_REQUESTS} during: {_tally(sent_during)}"
                )
            case FaultKind.CONSUMER_RECREATE:
                group_index, index = divmod(planned.target, self.config.sidecars)
                group = self.groups[group_index].name
                before = self.active.get((group, index))
                done = self.recreated[(group, index)]
                self.recreate[(group, index)].set()
                deadline = self.history.now() + 60.0
                # Done once an instance other than the old one has been created.
                while self.history.now() < deadline:
                    done.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), 1.0)
                    if self.active.get((group, index)) is not before:
                        break
                now_active = self.active.get((group, index))
                return f"{group}/c{index}", (
                    f"{before.id if before else '?'} deleted, "
                    f"{now_active.id if now_active else '?'} "
                    "created"
                )
            case FaultKind.ZOOKEEPER_PAUSE:
                self._signal_zookeeper(signal.SIGSTOP)
                self._zookeeper_paused = True
                try:
                    await asyncio.sleep(planned.duration_s)
                finally:
                    self._signal_zookeeper(signal.SIGCONT)
                    self._zookeeper_paused = False
                return "zookeeper", f"paused {planned.duration_s:.1f} s"
            case FaultKind.BROKER_KILL:
                broker = planned.target
                self._broker_down = broker
                await asyncio.to_thread(self.local.stop_broker, broker, kill=True)
                await asyncio.sleep(planned.duration_s)
                await asyncio.to_thread(self.local.start_broker, broker, 120.0)
                self._broker_down = None
                return f"broker {broker}", f"down {planned.duration_s:.1f} s, then restarted"
            case FaultKind.CALLBACK_REFUSAL:
                self.refusing_callbacks = True
                try:
                    self._fault_change(planned)
                    await asyncio.sleep(planned.duration_s)
                finally:
                    self.refusing_callbacks = False
                refused = sum(self.history.refused_callbacks.values())
                return "callback endpoints", (
                    f"503 for {planned.duration_s:.1f} s ({refused} refused so far)"
                )
        raise AssertionError(planned.kind)

    def _burst(self, slot: SidecarSlot, first: int) -> asyncio.Future[list[str]]:
        """``BURST_REQUESTS`` concurrent one-record produces through ``slot``, each with a key
        of its own (sequence 0, numbered from ``first``), recorded like any producer's;
        their outcomes."""
        producer = BURST_PRODUCER + len(self.history.faults)
        assert slot.process is not None
        client = slot.process

        async def one(number: int) -> str:
            topic = self.topics[number % len(self.topics)]
            key = f"z{producer}-k{number}"
            record = {"key": key, "value": {"producer": producer, "key": key, "seq": 0}}
            try:
                status, body = await _bounded(_produce(client, topic, [record]))
            except (ConnectionLost, TimeoutError) as exc:
                return type(exc).__name__
            if status != 200:
                return f"{status} {body.get('error_code')}"
            entry = body["offsets"][0]
            if entry["error_code"] is not None:
                return f"record {entry['error_code']}"
            self.history.ack(
                Acked(
                    (producer, key, 0),
                    topic,
                    int(entry["partition"]),
                    int(entry["offset"]),
                    int(body["generation"]),
                    client.id,
                    self.history.now(),
                )
            )
            return "acknowledged"

        return asyncio.gather(*(one(n) for n in range(first, first + BURST_REQUESTS)))

    def _fault_change(self, planned: PlannedFault) -> None:
        if planned.change is None:
            return
        topic_index, target = planned.change
        topic = self.topics[topic_index]
        if topic in self.changing:
            topic = self.topics[1 - topic_index]  # the other one, if it is free
        first = (planned.target + 1) % len(self.slots)
        task = self._start_change(topic, target, first, ChangeVia.HTTP)
        if task is not None:
            self.fault_changes.append(task)

    def _signal_zookeeper(self, sig: signal.Signals) -> None:
        state = self.local.state
        assert state is not None
        record = state.processes["zookeeper"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, sig)

    # Generation logs and retention ------------------------------------------------------------

    def _keep_log(self, topic: str, description: dict[str, Any]) -> None:
        self.history.kept_logs[topic].add(log_of_description(description), self.history.now())

    async def _watch_logs(self) -> None:
        """Read each topic's generation log from a running sidecar every
        ``look_every_s``, so that ``KeptLog`` has every generation before compaction
        folds it (besides the reads around each change)."""
        while True:
            for topic in self.topics:
                for slot in self.slots:
                    if not slot.running or slot.process is None:
                        continue
                    with contextlib.suppress(ConnectionLost, TimeoutError, KeyError):
                        status, body = await _bounded(
                            _admin(slot.process, "GET", f"/admin/topics/{topic}"), 3.0
                        )
                        if status == 200:
                            self._keep_log(topic, body)
                            break
            await asyncio.sleep(self.config.look_every_s)

    async def _trim_loop(self) -> None:
        """Retention of the delete topic, as an operator's would be, but only below what
        both groups committed (so nothing acknowledged is removed before both groups
        had it): every ``trim_every_s``, read the records about to go (the barrier check
        still checks them) and DeleteRecords below the groups' smallest commit."""
        topic = self.topics[0]
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.cluster.kafka_bootstrap, request_timeout_ms=5000
        )
        await admin.start()
        try:
            while True:
                await asyncio.sleep(self.config.trim_every_s * self._rng.uniform(0.8, 1.2))
                try:
                    await asyncio.wait_for(self._trim(admin, topic), 60.0)
                except Exception as exc:
                    self.history.trims_failed[topic] += 1
                    self.say(f"trimming {topic} failed: {exc!r}")
        finally:
            await admin.close()

    async def _trim(self, admin: AIOKafkaAdminClient, topic: str) -> None:
        lowest: dict[int, int] | None = None
        for group in self.groups:
            offsets = await admin.list_consumer_group_offsets(group.name)
            mine = {
                tp.partition: meta.offset
                for tp, meta in offsets.items()
                if tp.topic == topic and meta.offset >= 0
            }
            lowest = (
                mine
                if lowest is None
                else {p: min(o, mine[p]) for p, o in lowest.items() if p in mine}
            )
        before = {
            p: offset for p, offset in (lowest or {}).items() if offset > self.trimmed_to.get(p, 0)
        }
        if not before:
            return
        since = {p: self.trimmed_to.get(p, 0) for p in before}
        records = await _read_range(self.cluster.kafka_bootstrap, topic, since, before)
        self.trimmed[topic].extend(records)
        request = {TopicPartition(topic, p): RecordsToDelete(o) for p, o in before.items()}
        low = await admin.delete_records(request)
        for tp, start in low.items():
            self.trimmed_to[tp.partition] = max(self.trimmed_to.get(tp.partition, 0), int(start))
        self.history.trims.append(Trim(self.history.now(), topic, before, len(records)))
        self.say(f"trimmed {_short(topic)}: {len(records)} records read, then deleted")

    # Lock sampling ----------------------------------------------------------------------------

    async def _watch_locks(self) -> None:
        zookeeper = KazooClient(hosts=self.cluster.zookeeper_hosts, timeout=10.0)
        await asyncio.to_thread(zookeeper.start, 15)
        try:
            while True:
                if zookeeper.connected:
                    try:
                        seen = await asyncio.to_thread(self._sample_locks, zookeeper)
                    except Exception:
                        self.history.lock_samples_failed += 1
                    else:
                        now = self.history.now()
                        for node, (topic, owner, phase) in seen.items():
                            held = self.history.locks.get(node)
                            first = held.first_seen if held is not None else now
                            self.history.locks[node] = LockSighting(
                                topic, node.rsplit("/", 1)[1], owner, first, now, phase
                            )
                else:
                    self.history.lock_samples_failed += 1
                await asyncio.sleep(1.0)
        finally:
            await asyncio.to_thread(_stop_kazoo, zookeeper)

    async def _watch_commits(self) -> None:
        """Sample both groups' committed offsets about once a second (the hand-off check
        tells a due repeat of keys_revoked from a spurious one by them)."""
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.cluster.kafka_bootstrap, request_timeout_ms=5000
        )
        await admin.start()
        try:
            while True:
                for group in self.groups:
                    try:
                        offsets = await asyncio.wait_for(
                            admin.list_consumer_group_offsets(group.name), 10.0
                        )
                    except Exception:
                        self.history.commit_samples_failed += 1
                        continue
                    for tp, meta in offsets.items():
                        if meta.offset >= 0:
                            self.history.committed(group.name, tp.topic, tp.partition, meta.offset)
                await asyncio.sleep(1.0)
        finally:
            await admin.close()

    async def _watch_rebalances(self) -> None:
        """Scrape every running sidecar's rebalance counters about every 2 s."""
        while True:
            for slot in self.slots:
                process = slot.process
                if process is None or not slot.running:
                    continue
                try:
                    async with asyncio.timeout(5.0):
                        async with process.http.get("/metrics") as response:
                            text = await response.text()
                except (aiohttp.ClientError, TimeoutError):
                    continue
                for family in text_string_to_metric_families(text):
                    if family.name not in REBALANCE_COUNTERS:
                        continue
                    for sample in family.samples:
                        if sample.name.endswith("_total"):
                            key = (process.id, family.name, sample.labels.get("group", ""))
                            self._rebalance_samples[key] = int(sample.value)
            await asyncio.sleep(2.0)

    def _rebalance_totals(self) -> dict[str, tuple[int, int]]:
        totals: dict[str, list[int]] = {g.name: [0, 0] for g in self.groups}
        for (_, name, group), value in self._rebalance_samples.items():
            if group in totals:
                totals[group][REBALANCE_COUNTERS.index(name)] += value
        return {group: (done, asked) for group, (done, asked) in totals.items()}

    def _sample_locks(self, zookeeper: KazooClient) -> dict[str, tuple[str, str, str]]:
        seen = {}
        for topic in self.topics:
            path = f"{self.root}/locks/{topic}"
            try:
                children = zookeeper.get_children(path)
            except NoNodeError:
                continue
            if not children:
                continue
            try:
                raw, _ = zookeeper.get(f"{self.root}/ops/{topic}")
                phase = str(json.loads(raw)["phase"])
            except (NoNodeError, ValueError, KeyError):
                phase = "-"
            for child in children:
                try:
                    owner, _ = zookeeper.get(f"{path}/{child}")
                except NoNodeError:
                    continue
                seen[f"{path}/{child}"] = (topic, owner.decode(errors="replace"), phase)
        return seen

    # The end --------------------------------------------------------------------------------

    async def _drain(self, quiet_since: float) -> dict[str, str]:
        """Wait until every acknowledged record reached both groups (or the drain limit);
        at the liveness bound, note what the sidecars say about the groups still behind."""
        config = self.config
        evidence: dict[str, str] = {}
        bound_at = quiet_since + config.liveness_bound_s
        limit_at = quiet_since + max(config.drain_limit_s, config.liveness_bound_s)
        self.say(f"draining: {self._undelivered()}")
        compacted_read = 0.0
        while True:
            if self.history.now() - compacted_read > 3.0 and any(
                self.history.pending[g.name] for g in self.groups
            ):
                await self._excuse_compacted()
                compacted_read = self.history.now()
            behind = [g.name for g in self.groups if self.history.undelivered(g.name)]
            if not behind:
                self.say("every acknowledged record reached every group")
                return evidence
            now = self.history.now()
            if now >= bound_at and not evidence:
                for group in behind:
                    evidence[group] = await self._describe_group(group)
                self.say(f"liveness bound passed: {self._undelivered()}")
            if now >= limit_at:
                self.say(f"drain limit passed: {self._undelivered()}")
                return evidence
            await asyncio.sleep(0.2)

    async def _excuse_compacted(self) -> None:
        """Acknowledged records of the compacted topic that compaction removed before a
        group read them: nobody has to receive them."""
        client = await self._any_client()
        if client is None:
            return
        topic = self.topics[1]
        try:
            status, body = await _bounded(_admin(client, "GET", f"/admin/topics/{topic}"), 10.0)
        except (ConnectionLost, TimeoutError):
            return
        if status != 200:
            return
        log = log_of_description(body)
        modes = tuple(PartitionMode(p["mode"]) for p in body["partitions"])
        try:
            starts, ends, records = await _read_committed(
                self.cluster.kafka_bootstrap, topic, int(body["physical_count"])
            )
        except Exception as exc:  # a read during the drain only saves waiting
            self.history.notes.append(f"reading {topic} during the drain failed: {exc!r}")
            return
        snapshot = TopicSnapshot(topic, True, log, modes, starts, ends, records)
        self.history.excuse(compacted_away(self.history, snapshot))

    def _undelivered(self) -> str:
        return ", ".join(
            f"{g.name} {self.history.undelivered(g.name):,} undelivered" for g in self.groups
        )

    async def _describe_group(self, group: str) -> str:
        """What the group looks like to the sidecars: each live instance's assignment,
        the waits announced in ZooKeeper, the generation each sidecar knows, and the
        committed offsets against each partition's end and mode."""
        parts = []
        assigned_anywhere: set[tuple[str, int]] = set()
        for (name, index), incarnation in sorted(self.active.items()):
            if name != group or not self.slots[index].running:
                continue
            client = await self.slots[index].client()
            try:
                path = f"/consumers/{group}/instances/{incarnation.name}/assignments"
                status, body = await _bounded(_call(client, "GET", path), 10.0)
            except (ConnectionLost, TimeoutError) as exc:
                parts.append(f"{incarnation.id}: {type(exc).__name__}")
                continue
            assigned = (
                [f"{_short(p['topic'])}[{p['partition']}]" for p in body["partitions"]]
                if status == 200
                else [f"{status}"]
            )
            if status == 200:
                assigned_anywhere |= {(p["topic"], p["partition"]) for p in body["partitions"]}
            parts.append(f"{incarnation.id} assigned {' '.join(assigned) or 'nothing'}")
        waits = await asyncio.to_thread(self._read_waits, group)
        parts.append("waits announced: " + (", ".join(waits) or "none"))
        known = []
        for slot in self.slots:
            if not slot.running:
                continue
            client = await slot.client()
            for topic in self.topics:
                with contextlib.suppress(ConnectionLost, TimeoutError, KeyError):
                    status, body = await _bounded(_call(client, "GET", f"/topics/{topic}"), 10.0)
                    if status == 200:
                        known.append(f"{client.id} {_short(topic)} g{body['generation']}")
        parts.append("generations known: " + ", ".join(known))
        admin = AIOKafkaAdminClient(bootstrap_servers=self.cluster.kafka_bootstrap)
        try:
            await admin.start()
            committed = await admin.list_consumer_group_offsets(group)
        except Exception as exc:
            committed = {}
            parts.append(f"committed offsets unreadable: {exc!r}")
        finally:
            await admin.close()
        modes: dict[str, list[str]] = {}
        for topic in self.topics:
            any_client = await self._any_client()
            if any_client is None:
                continue
            with contextlib.suppress(ConnectionLost, TimeoutError):
                status, body = await _bounded(
                    _admin(any_client, "GET", f"/admin/topics/{topic}"), 10.0
                )
                if status == 200:
                    modes[topic] = [p["mode"] for p in body["partitions"]]
        ends = await self._end_offsets(
            {topic: len(topic_modes) for topic, topic_modes in modes.items()}
        )
        behind = []
        for tp, end in sorted(ends.items()):
            offset = committed.get(tp)
            mine = offset.offset if offset is not None else 0
            if mine < end:
                mode = modes.get(tp.topic, [])
                mode_text = mode[tp.partition] if tp.partition < len(mode) else "?"
                owner = "" if (tp.topic, tp.partition) in assigned_anywhere else " UNASSIGNED"
                behind.append(
                    f"{_short(tp.topic)}[{tp.partition}] {mode_text}{owner} committed {mine}/{end}"
                )
        parts.append("behind: " + (", ".join(behind) or "nothing"))
        return "; ".join(parts)

    def _read_waits(self, group: str) -> list[str]:
        zookeeper = KazooClient(hosts=self.cluster.zookeeper_hosts)
        try:
            zookeeper.start(timeout=10)
            names = zookeeper.get_children(f"{self.root}/groups/{group}/waits")
        except Exception as exc:
            return [f"unreadable ({exc!r})"]
        finally:
            _stop_kazoo(zookeeper)
        # <topic>:<source>:<boundary>:<instance>
        return sorted(
            f"{_short(topic)}[{source}] to {boundary} by {instance}"
            for topic, source, boundary, instance in (n.rsplit(":", 3) for n in names)
        )

    async def _any_client(self) -> SidecarProcess | None:
        for slot in self.slots:
            if slot.running:
                return await slot.client()
        return None

    async def _end_offsets(self, counts: dict[str, int]) -> dict[TopicPartition, int]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.cluster.kafka_bootstrap, isolation_level="read_committed"
        )
        await consumer.start()
        try:
            partitions = [
                TopicPartition(topic, p) for topic, count in counts.items() for p in range(count)
            ]
            return dict(await consumer.end_offsets(partitions)) if partitions else {}
        finally:
            await consumer.stop()

    async def _snapshots(self) -> list[TopicSnapshot]:
        client = await self._any_client()
        assert client is not None, "no sidecar is running at the end of the run"
        descriptions = {topic: await client.describe(topic) for topic in self.topics}
        compacted = self.topics[1]
        await self._force_compaction(compacted, int(descriptions[compacted]["physical_count"]))
        snapshots = []
        for topic, description in descriptions.items():
            config = description["config"]
            self._keep_log(topic, description)
            stored_log = log_of_description(description)
            modes = tuple(PartitionMode(p["mode"]) for p in description["partitions"])
            starts, ends, records = await _read_committed(
                self.cluster.kafka_bootstrap,
                topic,
                int(description["physical_count"]),
                self._acked_ends(topic),
            )
            # A trim whose deletion failed is read again by the next one: once each.
            every = {(r.partition, r.offset): r for r in (*self.trimmed[topic], *records)}
            kept = self.history.kept_logs[topic]
            try:
                log = kept.full()
            except ValueError:
                log = stored_log  # check_generation_log says why
            snapshot = TopicSnapshot(
                topic,
                bool(config["compacted"]),
                log,
                modes,
                starts,
                ends,
                [every[where] for where in sorted(every)],
                stored_log=stored_log,
            )
            if snapshot.compacted:
                snapshot.cleaned_up_to = self._cleaned_up_to(topic)
            if log is not stored_log:
                snapshot.fold_notes = await self._fold_evidence(topic, log, starts)
            snapshots.append(snapshot)
        return snapshots

    async def _fold_evidence(
        self, topic: str, log: GenerationLog, starts: dict[int, int]
    ) -> list[str]:
        """How far the log could be folded at the end, by the log starts alone and with
        what the groups owe (``foldable_count``), and the revocations that stop it."""
        groups: dict[str, GroupHandoff] = {}
        zookeeper = KazooClient(hosts=self.cluster.zookeeper_hosts)
        try:
            await asyncio.to_thread(zookeeper.start, 10)
            for group in self.groups:
                committed = self.history.latest_commits(group.name, topic)
                names = await asyncio.to_thread(
                    zookeeper.get_children, f"{self.root}/groups/{group.name}/revoked"
                )
                acknowledged = {
                    (int(q), int(g))
                    for t, q, g in (name.rsplit(":", 2) for name in names)
                    if t == topic
                }
                groups[group.name] = GroupHandoff(committed, frozenset(acknowledged))
        except Exception as exc:
            return [f"fold evidence unreadable: {exc!r}"]
        finally:
            await asyncio.to_thread(_stop_kazoo, zookeeper)
        by_starts = foldable_count(log, starts, groups=())
        with_groups = foldable_count(log, starts, groups=groups.values())
        notes = [
            f"foldable at the end: to generation {by_starts} by the log starts alone, to "
            f"{with_groups} with what the groups owe"
        ]
        if with_groups < by_starts:
            blocked = with_groups + 1
            owing = [
                f"{name} owes keys_revoked({q}, {blocked}) (committed {handoff.committed[q]})"
                for name, handoff in groups.items()
                for q in range(log[blocked].physical_count)
                if q in handoff.committed
                and (q, blocked) not in handoff.acknowledged
                and any(
                    r.generation == blocked and r.boundary > 0 for r in revocation_points(log, q)
                )
            ]
            notes += owing[:8]
        return notes

    def _acked_ends(self, topic: str) -> dict[int, int]:
        """Per partition of ``topic``, one past the highest acknowledged offset."""
        ends: dict[int, int] = {}
        for acked in self.history.acked.values():
            if acked.topic == topic:
                ends[acked.partition] = max(ends.get(acked.partition, 0), acked.offset + 1)
        return ends

    async def _force_compaction(self, topic: str, partitions: int) -> None:
        """Roll every partition's active segment (one marker record, once the segment is
        older than segment.ms) and wait until the cleaner has cleaned up to the marker."""
        await asyncio.sleep(self.config.segment_ms / 1000 + 0.5)
        producer = AIOKafkaProducer(bootstrap_servers=self.cluster.kafka_bootstrap, acks="all")
        await producer.start()
        markers = {}
        try:
            for partition in range(partitions):
                sent = await producer.send_and_wait(
                    topic,
                    key=b"chaos-roll",
                    value=b"roll",
                    partition=partition,
                    headers=[(ROLL_HEADER, b"1")],
                )
                markers[partition] = sent.offset
        finally:
            await producer.stop()
        starts = await _log_starts(self.cluster.kafka_bootstrap, topic, partitions)
        # Where everything below the marker was truncated there is nothing to clean.
        waiting = {p: o for p, o in markers.items() if o > starts.get(p, 0)}
        deadline = self.history.now() + self.config.compaction_wait_s
        while self.history.now() < deadline:
            cleaned = self._cleaned_up_to(topic)
            if all(cleaned.get(p, 0) >= offset for p, offset in waiting.items()):
                self.say(f"compaction of {topic} reached the markers")
                return
            await asyncio.sleep(1.0)
        self.say(f"compaction of {topic} did not reach every marker: {self._cleaned_up_to(topic)}")

    def _cleaned_up_to(self, topic: str) -> dict[int, int]:
        """The log cleaner's checkpoint per partition, the smallest over the brokers."""
        found: dict[int, list[int]] = {}
        for node in self.local.node_ids():
            path = self.local.work_dir / f"kafka-{node}" / "data" / "cleaner-offset-checkpoint"
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            for line in lines[2:]:
                parts = line.split()
                if len(parts) == 3 and parts[0] == topic:
                    found.setdefault(int(parts[1]), []).append(int(parts[2]))
        return {p: min(offsets) for p, offsets in found.items()}


# Helpers ------------------------------------------------------------------------------------


def _tally(outcomes: list[str]) -> str:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))


def _short(topic: str) -> str:
    """``chaos-delete-1a2b3c`` as ``delete``: evidence lines name many partitions."""
    return topic.split("-")[1] if topic.count("-") >= 2 else topic


def _refusal(status: int, body: dict[str, Any]) -> str:
    code = body.get("error_code")
    if code == 40930:
        return "rolled_back"
    return f"{status} {code}"


async def _bounded(awaitable: Any, limit: float = REQUEST_LIMIT_S) -> Any:
    return await asyncio.wait_for(awaitable, limit)


async def _call(
    client: SidecarProcess,
    method: str,
    path: str,
    body: object | None = None,
    params: dict[str, str] | None = None,
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body)
    try:
        async with client.http.request(
            method, path, data=data, headers={"Content-Type": CONSUMER_JSON}, params=params
        ) as response:
            raw = await response.read()
            return response.status, (json.loads(raw) if raw else None)
    except (aiohttp.ClientError, RuntimeError) as exc:
        raise ConnectionLost(repr(exc)) from exc


async def _produce(
    client: SidecarProcess,
    topic: str,
    records: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    try:
        return await client.produce(topic, records, extra=extra)
    except (aiohttp.ClientError, RuntimeError) as exc:
        raise ConnectionLost(repr(exc)) from exc


async def _admin(
    client: SidecarProcess, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    try:
        return await client.admin(method, path, body)
    except (aiohttp.ClientError, RuntimeError) as exc:
        raise ConnectionLost(repr(exc)) from exc


async def _log_starts(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        starts = await consumer.beginning_offsets(assigned)
        return {tp.partition: o for tp, o in starts.items()}
    finally:
        await consumer.stop()


async def _remove_data(cluster: ClusterEndpoints, topics: list[str], root: str) -> None:
    """Cleanup only: a failure is ignored, it must not mask the outcome."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    with contextlib.suppress(Exception):
        await admin.start()
        await admin.delete_topics(topics)
    with contextlib.suppress(Exception):
        await admin.close()

    def delete_root() -> None:
        zookeeper = KazooClient(hosts=cluster.zookeeper_hosts)
        with contextlib.suppress(Exception):
            zookeeper.start(timeout=10)
            zookeeper.delete(root, recursive=True)
        _stop_kazoo(zookeeper)

    await asyncio.to_thread(delete_root)


def _stop_kazoo(zookeeper: KazooClient) -> None:
    with contextlib.suppress(Exception):
        zookeeper.stop()
        zookeeper.close()


async def _read_committed(
    bootstrap: str, topic: str, partitions: int, acked_ends: dict[int, int] | None = None
) -> tuple[dict[int, int], dict[int, int], list[StoredRecord]]:
    """Log start, end (last stable offset) and every record of each partition, read
    with ``read_committed`` from the beginning.

    A read whose end offsets lie below an acknowledged record (``acked_ends``: per
    partition, one past the highest acknowledged offset) saw a leader that had not
    caught up: it is read again, up to ``READ_TRIES`` times. A position that leaves the
    log raises rather than jumping to its end (``auto_offset_reset="none"``), so that
    nothing is skipped unseen.
    """
    for attempt in range(1, READ_TRIES + 1):
        starts, ends, records = await _read_once(bootstrap, topic, partitions)
        short = {
            p: (ends.get(p, 0), needed)
            for p, needed in (acked_ends or {}).items()
            if ends.get(p, 0) < needed and p < partitions
        }
        if not short or attempt == READ_TRIES:
            if short:
                raise RuntimeError(
                    f"reading {topic}: end offsets stay below acknowledged records "
                    f"(partition: (end, needed)) {short}"
                )
            return starts, ends, records
        await asyncio.sleep(2.0)
    raise AssertionError("unreachable")


async def _read_once(
    bootstrap: str, topic: str, partitions: int
) -> tuple[dict[int, int], dict[int, int], list[StoredRecord]]:
    return await _read(bootstrap, topic, range(partitions))


async def _read_range(
    bootstrap: str, topic: str, since: dict[int, int], before: dict[int, int]
) -> list[StoredRecord]:
    """The records of each partition ``p`` of ``before`` from ``since[p]`` (or its log
    start, if that is higher) up to ``before[p]``, read with ``read_committed``."""
    _, _, records = await _read(bootstrap, topic, sorted(before), since, before)
    return records


async def _read(
    bootstrap: str,
    topic: str,
    partitions: Iterable[int],
    since: dict[int, int] | None = None,
    before: dict[int, int] | None = None,
) -> tuple[dict[int, int], dict[int, int], list[StoredRecord]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="none",
    )
    await consumer.start()
    try:
        assigned = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(assigned)
        starts = await consumer.beginning_offsets(assigned)
        ends = await consumer.end_offsets(assigned)
        for tp in assigned:
            if since is not None:
                starts[tp] = max(starts[tp], since.get(tp.partition, 0))
            if before is not None:
                ends[tp] = min(ends[tp], before[tp.partition])
            consumer.seek(tp, starts[tp])
        records: list[StoredRecord] = []
        remaining = {tp for tp in assigned if ends[tp] > starts[tp]}
        idle = 0
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=2000)
            idle = 0 if batches else idle + 1
            if idle > 10:
                raise RuntimeError(f"reading {topic}: nothing for 20 s, still {remaining}")
            for tp, batch in batches.items():
                for record in batch:
                    if record.offset >= ends[tp]:
                        continue
                    records.append(
                        StoredRecord(
                            tp.partition,
                            record.offset,
                            record.key,
                            record.value,
                            {k: (bytes(v) if v is not None else None) for k, v in record.headers},
                            record.timestamp,
                        )
                    )
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return (
            {tp.partition: o for tp, o in starts.items()},
            {tp.partition: o for tp, o in ends.items()},
            records,
        )
    finally:
        await consumer.stop()
