"""The demo's application side: everything here goes through the sidecars' HTTP API.

Producers (one per sidecar) write keyed records, each key with its own sequence
number, in the REST Proxy v2 json format. An ordered consumer group of one instance per
sidecar reads them back through the gate, with hand-off callbacks to a small loopback
app run here, which answers each ``keys_revoked`` / ``keys_assigned`` after a short
"flush" or "load". Under that load the topic is expanded with the CLI
(``sidecar topics expand``) and shrunk with the admin API, while a progress line is
printed every second. Everything observed goes into a ``Ledger`` (``summary``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from ordered_dev.demo.processes import DemoError, run_printing, sidecar_command
from ordered_dev.demo.summary import Change, Handoff, Ledger, Request, Samples, total

JSON_V2 = "application/vnd.kafka.json.v2+json"
CONSUMER_V2 = "application/vnd.kafka.v2+json"
HANDOFF_WORK_S = 0.02
"""How long the app takes to flush or load a partition's key state in a callback."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The load and the timeline of one run."""

    warmup_s: float
    """Load before the expansion."""
    between_s: float
    """Load between the expansion and the shrink."""
    after_s: float
    """Load after the shrink."""
    keys_per_producer: int
    records_per_request: int
    requests_per_s: float
    """Per producer."""
    initial_count: int = 4
    expand_to: int = 6
    shrink_to: int = 5
    drain_limit_s: float = 60.0
    """How long the group may take to deliver everything once the producers stop."""


# A request waits for its transaction to commit (about 0.1 s on a quiet 2-core machine,
# several times that when it is busy): each producer has one request in flight, so that
# a key's records are sent in order, and the rate is what the latency allows up to this.
FULL = Plan(
    warmup_s=20,
    between_s=30,
    after_s=25,
    keys_per_producer=100,
    records_per_request=25,
    requests_per_s=4,
)
QUICK = Plan(
    warmup_s=4,
    between_s=6,
    after_s=5,
    keys_per_producer=20,
    records_per_request=10,
    requests_per_s=4,
)


class Console:
    """Plain lines on stdout, stamped with the seconds since the load began."""

    def __init__(self) -> None:
        self.t0: float | None = None

    def say(self, text: str) -> None:
        stamp = "" if self.t0 is None else f"[{time.monotonic() - self.t0:6.1f} s] "
        print(stamp + text, flush=True)


@dataclass(frozen=True, slots=True)
class Sidecar:
    """A sidecar as an application sees it: a URL, and the admin token."""

    name: str
    url: str
    http: aiohttp.ClientSession
    token: str

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        admin: bool = False,
        content_type: str = CONSUMER_V2,
        **params: str,
    ) -> tuple[int, Any]:
        headers = {"Content-Type": content_type}
        if admin:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body)
        async with self.http.request(
            method, path, data=data, headers=headers, params=params
        ) as response:
            raw = await response.read()
            return response.status, (json.loads(raw) if raw else None)

    async def describe(self, topic: str) -> dict[str, Any]:
        status, body = await self.call("GET", f"/admin/topics/{topic}", admin=True)
        if status != 200:
            raise DemoError(f"describing {topic} on {self.name}: {status} {body}")
        result: dict[str, Any] = body
        return result

    async def scrape(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        async with self.http.get("/metrics") as response:
            text = await response.text()
        return {
            (sample.name, frozenset(sample.labels.items())): float(sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


async def scrape_all(sidecars: list[Sidecar]) -> Samples:
    """The samples of every sidecar, added up (each sidecar counts only its own)."""
    summed: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for samples in await asyncio.gather(*(s.scrape() for s in sidecars)):
        for key, value in samples.items():
            summed[key] = summed.get(key, 0.0) + value
    return summed


# The hand-off app ------------------------------------------------------------------------


class HandoffApp:
    """The application's callback endpoint on loopback: it "flushes" a partition's key
    state on keys_revoked and "loads" it on keys_assigned, then answers 204."""

    def __init__(self, ledger: Ledger, say: Callable[[str], None]) -> None:
        self.ledger = ledger
        self.say = say
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/handoff", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/handoff"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        began = time.monotonic()
        kind = body.get("type")
        if kind in ("keys_revoked", "keys_assigned"):
            await asyncio.sleep(HANDOFF_WORK_S)
            handoff = Handoff(
                began,
                time.monotonic(),
                kind,
                str(body["instance_id"]),
                int(body["partition"]),
                int(body["generation"]),
            )
            self.ledger.handoffs.append(handoff)
            work = "flushed" if kind == "keys_revoked" else "loaded"
            self.say(
                f"hand-off: {kind}(p{handoff.partition}, generation {handoff.generation}) "
                f"to {handoff.instance}: state {work}"
            )
        return web.Response(status=204)


# Producers and consumers -----------------------------------------------------------------


async def produce(
    sidecar: Sidecar, producer: int, topic: str, plan: Plan, ledger: Ledger, stop: asyncio.Event
) -> None:
    """Paced requests of ``plan.records_per_request`` keyed records (the producer's keys in
    turn, each with its next sequence number) until ``stop``. A request held by a barrier
    delays this producer; the lost slots are not made up for with a burst."""
    keys = [f"p{producer}-k{i}" for i in range(plan.keys_per_producer)]
    period = 1.0 / plan.requests_per_s
    cursor = 0
    next_at = time.monotonic()
    while not stop.is_set():
        batch = [keys[(cursor + i) % len(keys)] for i in range(plan.records_per_request)]
        cursor += len(batch)
        sent = []
        for key in batch:
            seq = ledger.next_seq[key]
            ledger.next_seq[key] += 1
            sent.append((key, seq))
        records = [{"key": k, "value": {"key": k, "seq": s}} for k, s in sent]
        began = time.monotonic()
        try:
            status, body = await sidecar.call(
                "POST", f"/topics/{topic}", {"records": records}, content_type=JSON_V2
            )
        except aiohttp.ClientError as exc:
            ledger.refused[f"connection error ({type(exc).__name__})"] += 1
            await asyncio.sleep(0.5)
            continue
        ledger.requests.append(Request(began, time.monotonic() - began, status))
        if status != 200:
            ledger.refused[f"{status} {body.get('error_code') if body else ''}"] += 1
        else:
            generation = int(body["generation"])
            for (key, seq), entry in zip(sent, body["offsets"], strict=True):
                if entry["error_code"] is not None:
                    ledger.refused[f"record {entry['error_code']}"] += 1
                    continue
                ledger.acknowledged.add((key, seq))
                ledger.placement[key][generation] = int(entry["partition"])
        next_at += period
        now = time.monotonic()
        if next_at < now:
            next_at = now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), next_at - now)


@dataclass
class Consumer:
    sidecar: Sidecar
    group: str
    name: str
    assignment: list[int] = field(default_factory=list)

    @property
    def path(self) -> str:
        return f"/consumers/{self.group}/instances/{self.name}"

    @classmethod
    async def create(
        cls, sidecar: Sidecar, group: str, name: str, topic: str, callback_url: str
    ) -> Consumer:
        config = {
            "name": name,
            "format": "json",
            "auto.offset.reset": "earliest",
            "auto.commit.enable": "true",
            "consumer.request.timeout.ms": 500,
            "callback_url": callback_url,
        }
        status, body = await sidecar.call("POST", f"/consumers/{group}", config)
        if status != 200:
            raise DemoError(f"creating consumer {name} on {sidecar.name}: {status} {body}")
        consumer = cls(sidecar, group, name)
        status, body = await sidecar.call(
            "POST", f"{consumer.path}/subscription", {"topics": [topic]}
        )
        if status != 204:
            raise DemoError(f"subscribing {name}: {status} {body}")
        return consumer

    async def read(self, ledger: Ledger, stop: asyncio.Event) -> None:
        """Poll until ``stop``, appending each record to the ledger as it arrives."""
        while not stop.is_set():
            try:
                async with self.sidecar.http.get(
                    f"{self.path}/records", headers={"Accept": JSON_V2}
                ) as response:
                    raw = await response.read()
                    status = response.status
            except aiohttp.ClientError as exc:
                ledger.poll_errors[f"{self.name}: {type(exc).__name__}"] += 1
                await asyncio.sleep(0.2)
                continue
            items: Any = json.loads(raw) if raw else []
            if status != 200:
                ledger.poll_errors[f"{status} {items.get('error_code')}"] += 1
                await asyncio.sleep(0.2)
                continue
            for item in items:
                if "type" not in item:  # events come by callback; records have no type
                    ledger.delivered.append((item["value"]["key"], int(item["value"]["seq"])))

    async def refresh_assignment(self) -> list[int]:
        status, body = await self.sidecar.call("GET", f"{self.path}/assignments")
        if status == 200:
            self.assignment = sorted(p["partition"] for p in body["partitions"])
        return self.assignment

    async def delete(self) -> None:
        with contextlib.suppress(aiohttp.ClientError):
            await self.sidecar.call("DELETE", self.path)


# The run ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    topic: str
    group: str
    ledger: Ledger = field(default_factory=Ledger)
    changes: list[Change] = field(default_factory=list)
    description: dict[str, Any] = field(default_factory=dict)
    load_s: float = 0.0
    drain_s: float = math.nan


@dataclass
class Status:
    """What the progress line shows besides the figures."""

    activity: str = ""
    change_running: bool = False


async def _progress(
    sidecars: list[Sidecar], outcome: Outcome, status: Status, say: Callable[[str], None]
) -> None:
    """A line every second: generation and partitions, records produced and delivered,
    held produces, gate waits and hand-offs (from the sidecars' /metrics and the ledger)."""
    topic, ledger = outcome.topic, outcome.ledger
    last_produced, last_at = 0, time.monotonic()
    while True:
        await asyncio.sleep(1.0)
        try:
            samples, description = await asyncio.gather(
                scrape_all(sidecars), sidecars[0].describe(topic)
            )
        except (aiohttp.ClientError, DemoError) as exc:
            say(f"(progress: {exc!r})")
            continue
        now = time.monotonic()
        produced = len(ledger.acknowledged)
        rate = (produced - last_produced) / max(now - last_at, 1e-3)
        last_produced, last_at = produced, now
        modes = [p["mode"] for p in description["partitions"]]
        draining = modes.count("read_only")
        parts = f"{description['undeleted_count']} partitions"
        if draining:
            parts += f" + {draining} draining"
        phase = ""
        operation = description.get("operation")
        if status.change_running and isinstance(operation, dict):
            phase = f": {operation['phase']}"
        held_now = total(samples, "sidecar_produce_held_requests", topic=topic)
        holds = total(samples, "sidecar_produce_hold_seconds_count", topic=topic)
        waits = total(samples, "sidecar_gate_wait_seconds_count", topic=topic)
        gated = total(samples, "sidecar_gated_partitions", topic=topic)
        say(
            f"gen {description['generation']}, "
            f"{parts} | produced {produced:,} (+{rate:,.0f}/s) | delivered "
            f"{len(ledger.delivered):,} | held {held_now:.0f} now, {holds:.0f} so far | "
            f"gate waits {waits:.0f} ({gated:.0f} gated now) | hand-offs "
            f"{len(ledger.handoffs)}" + (f" | {status.activity}{phase}" if status.activity else "")
        )


async def _wait_for_assignments(
    consumers: list[Consumer], count: int, say: Callable[[str], None]
) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assignments = [await c.refresh_assignment() for c in consumers]
        covered = sorted(p for a in assignments for p in a)
        if covered == list(range(count)) and all(assignments):
            say(
                "group settled: "
                + ", ".join(f"{c.name} on {c.sidecar.name} reads {c.assignment}" for c in consumers)
            )
            return
        await asyncio.sleep(0.5)
    raise DemoError("the consumer group did not settle within 60 s")


async def _took(sidecar: Sidecar, topic: str, change: Change) -> float:
    """How long the change took on its coordinator: from the start its journal records
    (wall clock) to now, just after it answered. The CLI's own start is not in it."""
    operation = (await sidecar.describe(topic)).get("operation")
    if isinstance(operation, dict) and operation["from_generation"] == change.from_generation:
        return max(0.0, time.time() - float(operation["started_at"]))
    return change.ended - change.began


async def _begin_change(
    kind: str,
    sidecar: Sidecar,
    topic: str,
    target: int,
    via: str,
    status: Status,
    sidecars: list[Sidecar],
) -> Change:
    """A change about to be asked of ``sidecar``: where the topic stands, the metrics
    before it, and the status line saying it runs."""
    description = await sidecar.describe(topic)
    change = Change(
        kind,
        int(description["undeleted_count"]),
        target,
        via,
        began=time.monotonic(),
        from_generation=int(description["generation"]),
        metrics_before=await scrape_all(sidecars),
    )
    status.activity, status.change_running = f"{kind} {change.from_count}->{target}", True
    return change


async def _expand_with_cli(
    sidecar: Sidecar,
    outcome: Outcome,
    target: int,
    status: Status,
    sidecars: list[Sidecar],
    say: Callable[[str], None],
) -> Change:
    topic = outcome.topic
    via = f"the CLI on {sidecar.name}"
    change = await _begin_change("expand", sidecar, topic, target, via, status, sidecars)
    say(f"$ sidecar topics --url {sidecar.url} expand {topic} --to {target}")
    code = await run_printing(
        [*sidecar_command(), "topics", "--url", sidecar.url, "expand", topic, "--to", str(target)],
        lambda line: say(f"  | {line}"),
        env=os.environ | {"ORDERED_SIDECAR_ADMIN_TOKEN": sidecar.token},
    )
    change.ended = time.monotonic()
    change.outcome = "done" if code == 0 else f"the CLI exited with status {code}"
    change.took_s = await _took(sidecar, topic, change)
    status.activity, status.change_running = "", False
    return change


async def _shrink_with_api(
    sidecar: Sidecar,
    outcome: Outcome,
    target: int,
    status: Status,
    sidecars: list[Sidecar],
    say: Callable[[str], None],
) -> Change:
    topic = outcome.topic
    via = f"the admin API of {sidecar.name}"
    change = await _begin_change("shrink", sidecar, topic, target, via, status, sidecars)
    path = f"/admin/topics/{topic}/partition-count"
    say(
        f"$ curl -XPOST {sidecar.url}{path} -H 'Authorization: Bearer <token>' "
        f"-d '{{\"count\": {target}}}'"
    )
    code, body = await sidecar.call("POST", path, {"count": target}, admin=True)
    change.ended = time.monotonic()
    change.took_s = await _took(sidecar, topic, change)
    if code == 200:
        change.outcome = str(body["phase"])
        say(
            f"  -> 200: {body['from_count']} -> {body['target_count']} partitions "
            f"({body['phase']}) in {change.ended - change.began:.2f} s"
        )
    else:
        change.outcome = f"{code} {body}"
        say(f"  -> {code}: {body}")
    status.activity, status.change_running = "", False
    return change


async def run(
    sidecars: list[Sidecar],
    topic: str,
    group: str,
    plan: Plan,
    replication_factor: int,
    console: Console,
) -> Outcome:
    """Create ``topic``, load it through ``sidecars``, expand and shrink it, drain, and
    return what was observed. Raises DemoError when a step the rest needs fails."""
    say = console.say
    outcome = Outcome(topic, group)
    ledger = outcome.ledger
    status_code, body = await sidecars[0].call(
        "POST",
        "/admin/topics",
        {"name": topic, "partitions": plan.initial_count, "replication_factor": replication_factor},
        admin=True,
    )
    if status_code != 201:
        raise DemoError(f"creating {topic}: {status_code} {body}")
    say(
        f"topic {topic}: {plan.initial_count} partitions, replication factor "
        f"{replication_factor}, managed (generation 0, ordered delivery)"
    )

    app = HandoffApp(ledger, say)
    stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
    status = Status()
    tasks: list[asyncio.Task[None]] = []
    consumers: list[Consumer] = []
    await app.start()
    try:
        say(f"hand-off callbacks go to {app.url}")
        for index, sidecar in enumerate(sidecars, start=1):
            consumer = await Consumer.create(sidecar, group, f"c{index}", topic, app.url)
            consumers.append(consumer)
            tasks.append(asyncio.create_task(consumer.read(ledger, stop_consuming)))
        say(
            f"consumer group {group}: {', '.join(c.name for c in consumers)} "
            "(json, auto-commit, hand-off by callback), one instance per sidecar"
        )
        await _wait_for_assignments(consumers, plan.initial_count, say)

        producers = [
            asyncio.create_task(produce(s, i, topic, plan, ledger, stop_producing))
            for i, s in enumerate(sidecars, start=1)
        ]
        tasks += producers
        rate = plan.requests_per_s * plan.records_per_request * len(sidecars)
        say(
            f"producers p1..p{len(sidecars)}, one per sidecar, {plan.keys_per_producer} keys "
            f"each, about {rate:.0f} records/s in all"
        )
        console.t0 = time.monotonic()
        tasks.append(asyncio.create_task(_progress(sidecars, outcome, status, say)))

        await asyncio.sleep(plan.warmup_s)
        outcome.changes.append(
            await _expand_with_cli(sidecars[1], outcome, plan.expand_to, status, sidecars, say)
        )
        await asyncio.sleep(plan.between_s)
        outcome.changes.append(
            await _shrink_with_api(sidecars[2], outcome, plan.shrink_to, status, sidecars, say)
        )
        outcome.changes[0].metrics_after = outcome.changes[1].metrics_before
        await asyncio.sleep(plan.after_s)

        stop_producing.set()
        await asyncio.gather(*producers)
        outcome.load_s = time.monotonic() - console.t0
        status.activity = "producers stopped, the group drains"
        drain_began = time.monotonic()
        # Deliveries arrive in several instances' polls: look at the ledger every 0.2 s.
        while ledger.undelivered() and time.monotonic() - drain_began < plan.drain_limit_s:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        if not ledger.undelivered():
            outcome.drain_s = time.monotonic() - drain_began
            say(
                f"everything acknowledged was delivered ({outcome.drain_s:.1f} s after the "
                "producers stopped)"
            )
        else:
            say(
                f"{ledger.undelivered():,} acknowledged records still undelivered after "
                f"{plan.drain_limit_s:g} s"
            )
        outcome.changes[-1].metrics_after = await scrape_all(sidecars)
        outcome.description = await sidecars[0].describe(topic)
    finally:
        stop_producing.set()
        stop_consuming.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.delete() for c in consumers), return_exceptions=True)
        await app.stop()
        console.t0 = None
    return outcome


async def sidecar_clients(
    urls: list[tuple[str, str]], token: str
) -> tuple[list[Sidecar], Callable[[], Awaitable[None]]]:
    """Clients of the sidecars (name, url), and a coroutine function that closes them."""
    sessions = [aiohttp.ClientSession(url) for _, url in urls]
    clients = [
        Sidecar(name, url, session, token)
        for (name, url), session in zip(urls, sessions, strict=True)
    ]

    async def close() -> None:
        await asyncio.gather(*(s.close() for s in sessions))

    return clients, close
