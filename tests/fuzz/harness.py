"""Schemathesis against a running sidecar: topics to aim at, the run, and its numbers.

Used by the bounded runs of the test suite (``tests/integration/test_fuzz.py``) and by
the longer run (``python -m tests.fuzz.run --minutes N``). The schemathesis CLI runs as
a subprocess against the sidecar's served OpenAPI document, with:

* a configuration (``schemathesis.toml`` written per run) whose dictionaries make a
  generated topic, group or instance name one of the run's own most of the time, so
  requests reach past "not found" into the code that produces, subscribes, polls and
  commits; the rest stay random (and negative cases invalid);
* the hooks of ``tests.fuzz.hooks`` (small partition counts, writes only to the run's
  own topics, callbacks only to the run's own sink, one false positive dropped);
* every check but ``positive_data_acceptance`` (a valid request may well meet a state
  conflict, 409, or an unknown topic, 404).

The numbers come from the run's NDJSON event stream (every request and its answer)
and its JSON report (failures by kind).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

REPOSITORY: Final = Path(__file__).resolve().parents[2]
CHECKS_EXCLUDED: Final = ("positive_data_acceptance",)
STATEFUL_OPERATIONS: Final = (
    "createConsumer",
    "subscribe",
    "getSubscription",
    "assign",
    "poll",
    "commitOffsets",
    "getCommittedOffsets",
    "seekToBeginning",
    "unsubscribe",
    "deleteConsumer",
)
"""The consumer workflow the stateful run follows by the document's links:
create instance -> subscribe (or assign) -> poll -> commit -> delete."""
CHAIN: Final = ("createConsumer", "subscribe", "poll", "commitOffsets", "deleteConsumer")


@dataclass(frozen=True)
class FuzzTarget:
    """A sidecar and the names a run aims at."""

    url: str
    admin_token: str
    prefix: str
    """Every topic, group and instance the run makes starts with it."""
    topics: tuple[str, ...]
    groups: tuple[str, ...]
    instances: tuple[str, ...]
    callback_url: str
    cluster_id: str = ""
    """The Kafka cluster's id (REST Proxy v3 paths name it); empty: not known."""


@dataclass
class FuzzResult:
    requests: int = 0
    operations: set[str] = field(default_factory=set)
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    """One line per 5xx answer: operation, status, request URI, body."""
    failures: dict[str, int] = field(default_factory=dict)
    """Check failures by code and title (e.g. "ST101 Server error")."""
    filtered: int = 0
    errors: int = 0
    chains: int = 0
    """Walks along the document's links create -> subscribe -> poll -> commit -> delete,
    every step a 2xx."""
    links_followed: Counter[str] = field(default_factory=Counter)
    """Links followed from a 2xx to a 2xx, by "<source> -> <link name>"."""
    links: str = ""
    exit_code: int | None = None
    output: str = ""

    def summary(self) -> str:
        statuses = ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()))
        failures = ", ".join(f"{kind}: {n}" for kind, n in sorted(self.failures.items()))
        return (
            f"{self.requests} requests over {len(self.operations)} operations; "
            f"statuses {{{statuses}}}; failures {{{failures or 'none'}}} "
            f"({self.filtered} filtered); errors {self.errors}; "
            f"links followed {sum(self.links_followed.values())} "
            f"({len(self.links_followed)} distinct); "
            f"create->subscribe->poll->commit->delete by links {self.chains}"
            + (f"; links {self.links}" if self.links else "")
        )


def new_target(url: str, admin_token: str, callback_url: str, cluster_id: str = "") -> FuzzTarget:
    prefix = f"fz-{uuid.uuid4().hex[:6]}-"
    return FuzzTarget(
        url=url,
        admin_token=admin_token,
        prefix=prefix,
        topics=(f"{prefix}managed", f"{prefix}compacted", f"{prefix}plain", f"{prefix}wide"),
        groups=(f"{prefix}g1", f"{prefix}g2"),
        instances=(f"{prefix}c1", f"{prefix}c2", f"{prefix}c3"),
        callback_url=callback_url,
        cluster_id=cluster_id,
    )


async def prepare_topics(target: FuzzTarget, bootstrap: str, replication_factor: int) -> None:
    """Create the run's topics (two managed, one of them changed, two plain) with records."""
    managed, compacted, plain, wide = target.topics
    headers = {"Authorization": f"Bearer {target.admin_token}"}
    async with aiohttp.ClientSession(target.url) as http:
        for name, options in ((managed, {}), (compacted, {"compacted": True})):
            body = {"name": name, "partitions": 2, "replication_factor": replication_factor}
            async with http.post("/admin/topics", json=body | options, headers=headers) as r:
                assert r.status == 201, await r.text()
        async with http.post(
            f"/admin/topics/{managed}/partition-count", json={"count": 3}, headers=headers
        ) as r:
            assert r.status == 200, await r.text()
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(plain, 2, replication_factor), NewTopic(wide, 5, replication_factor)]
            )
        finally:
            await admin.close()
        records = [{"key": f"key-{i}", "value": {"n": i}} for i in range(30)]
        for topic in target.topics:
            for _ in range(50):  # new topics reach every broker's metadata within seconds
                async with http.post(
                    f"/topics/{topic}",
                    data=json.dumps({"records": records}),
                    headers={"Content-Type": "application/vnd.kafka.json.v2+json"},
                ) as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"could not produce to {topic}")


async def delete_topics(bootstrap: str, prefix: str) -> None:
    """Delete every Kafka topic whose name starts with ``prefix`` (the run's own)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        ours = [name for name in await admin.list_topics() if name.startswith(prefix)]
        if ours:
            await admin.delete_topics(ours)
    finally:
        await admin.close()


@asynccontextmanager
async def callback_sink() -> AsyncIterator[str]:
    """A local HTTP server that acknowledges every hand-off callback (2xx)."""

    async def acknowledge(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", acknowledge)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/handoff"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def _config(target: FuzzTarget) -> str:
    def values(items: Sequence[str]) -> str:
        return "[" + ", ".join(json.dumps(item) for item in items) + "]"

    bindings = {
        "path.topic": "topics",
        "path.topic_name": "topics",
        "path.group": "groups",
        "path.name": "instances",
        "body.name": "instances",
        "body.topics[*]": "topics",
        "body.partitions[*].topic": "topics",
        "body.offsets[*].topic": "topics",
        "body.timestamps[*].topic": "topics",
    }
    lines = [
        "[dictionaries.topics]",
        f"values = {values(target.topics)}",
        "[dictionaries.groups]",
        f"values = {values(target.groups)}",
        "[dictionaries.instances]",
        f"values = {values(target.instances)}",
        "[dictionaries.clusters]",
        f"values = {values([target.cluster_id] if target.cluster_id else ['unknown'])}",
        "[parameters]",
        *(
            f'"{key}" = {{ dictionary = "{name}", probability = 0.7 }}'
            for key, name in bindings.items()
        ),
        # REST Proxy v3 paths: mostly the real cluster, so records reach the produce path.
        '"path.cluster_id" = { dictionary = "clusters", probability = 0.8 }',
        # Response times are not judged: on a shared two-core machine they say more about
        # the neighbours than about the sidecar (schemathesis would fail a 10 s answer).
        "[checks]",
        "max_response_time = 600",
        # The stateful run is there to follow links; invalid input is the stateless run's.
        "[phases.stateful]",
        "max-steps = 12",
        "[phases.stateful.generation]",
        'mode = "positive"',
    ]
    return "\n".join(lines) + "\n"


async def run_schemathesis(
    target: FuzzTarget,
    workdir: Path,
    *,
    phases: str,
    max_time_s: int,
    operation_ids: Sequence[str] = (),
    seed: int | None = None,
    max_examples: int | None = None,
) -> FuzzResult:
    """One ``st run`` against ``target``; returns what it did and found.

    It stops after ``max_examples`` test cases per operation (or scenarios, for the
    stateful phase) when given, and after ``max_time_s`` in any case.
    """
    config = _write_config(workdir, target)
    reports = workdir / "reports"
    command = [
        str(Path(sys.executable).with_name("st")),
        "--config-file",
        str(config),
        "run",
        f"{target.url}/openapi.json",
        "--url",
        target.url,
        "-H",
        f"Authorization: Bearer {target.admin_token}",
        "--checks",
        "all",
        "--exclude-checks",
        ",".join(CHECKS_EXCLUDED),
        "--phases",
        phases,
        "--max-time",
        str(max_time_s),
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--report",
        "json,ndjson",
        "--report-dir",
        str(reports),
        "--no-color",
    ]
    for operation_id in operation_ids:
        command += ["--include-operation-id", operation_id]
    if seed is not None:
        command += ["--seed", str(seed)]
    if max_examples is not None:
        command += ["--max-examples", str(max_examples)]
    environment = dict(os.environ) | {
        "SCHEMATHESIS_HOOKS": "tests.fuzz.hooks",
        "PYTHONPATH": str(REPOSITORY),
        "FUZZ_TOPIC_PREFIX": target.prefix,
        "FUZZ_OWN_TOPICS": ",".join(target.topics),
        "FUZZ_CALLBACK_URL": target.callback_url,
    }
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=workdir,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    result = FuzzResult(exit_code=process.returncode, output=output.decode(errors="replace"))
    _collect(workdir, result)
    return result


def _write_config(workdir: Path, target: FuzzTarget) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "schemathesis.toml"
    config.write_text(_config(target))
    return config


def _collect(workdir: Path, result: FuzzResult) -> None:
    (workdir / "output.txt").write_text(result.output)
    for path in (workdir / "reports").glob("ndjson-*.ndjson"):
        _read_events(path, result)
    for path in (workdir / "reports").glob("json-*.json"):
        _read_report(path, result)
    for line in result.output.splitlines():
        if "API Links:" in line:
            result.links = line.split("API Links:", 1)[1].strip()


def _read_events(path: Path, result: FuzzResult) -> None:
    with path.open() as events:
        for line in events:
            event = json.loads(line)
            finished = event.get("ScenarioFinished")
            if finished is None:
                continue
            recorder = finished["recorder"]
            steps: dict[str, _Step] = {}
            for case_id, interaction in (recorder.get("interactions") or {}).items():
                response = interaction.get("response")
                if response is None:
                    continue
                status = int(response["status_code"])
                case = recorder["cases"][case_id]
                value = case["value"]
                label = f"{value['method']} {value['path']}"
                result.requests += 1
                # A stateful scenario's label is the run's, not an operation's.
                stateful = not recorder["label"].split(" ", 1)[0].isupper()
                result.operations.add(label if stateful else recorder["label"])
                result.statuses[status] += 1
                transition = case.get("transition") if case.get("is_transition_applied") else None
                steps[case_id] = _Step(
                    label=label,
                    ok=200 <= status < 300,
                    parent=None if transition is None else transition.get("parent_id"),
                    link=None if transition is None else transition["id"],
                )
                if status >= 500:
                    result.server_errors.append(
                        f"{label} -> {status} {interaction['request'].get('uri')}: "
                        f"{_body(response)[:300]}"
                    )
            _follow_links(steps, result)


_CHAIN_LABELS: Final = (
    "POST /consumers/{group}",
    "POST /consumers/{group}/instances/{name}/subscription",
    "GET /consumers/{group}/instances/{name}/records",
    "POST /consumers/{group}/instances/{name}/offsets",
    "DELETE /consumers/{group}/instances/{name}",
)


@dataclass(frozen=True)
class _Step:
    label: str
    ok: bool
    parent: str | None
    """The case whose response the link took its values from; None: not by a link."""
    link: str | None


def _follow_links(steps: dict[str, _Step], result: FuzzResult) -> None:
    for step in steps.values():
        parent = steps.get(step.parent) if step.parent is not None else None
        if parent is None or step.link is None or not (step.ok and parent.ok):
            continue
        # "POST /consumers/{group} -> [200] Subscribe -> POST ...": source and link name.
        source, _, rest = step.link.partition(" -> ")
        result.links_followed[f"{source} -> {rest.split(' -> ', 1)[0]}"] += 1
        if step.label == _CHAIN_LABELS[-1] and _walked_back(steps, step):
            result.chains += 1


def _walked_back(steps: dict[str, _Step], last: _Step) -> bool:
    """True when ``last``'s ancestors by links are the chain's earlier steps, all 2xx."""
    current: _Step | None = last
    for label in reversed(_CHAIN_LABELS):
        if current is None or current.label != label or not current.ok:
            return False
        current = steps.get(current.parent) if current.parent is not None else None
    return True


def _body(response: dict[str, Any]) -> str:
    content = response.get("content")
    if isinstance(content, dict) and "$base64" in content:
        return base64.b64decode(content["$base64"]).decode(errors="replace")
    return str(content or "")


def _read_report(path: Path, result: FuzzResult) -> None:
    report = json.loads(path.read_text())
    for failure in report.get("failures", []):
        result.failures[f"{failure['code']} {failure['title']}"] = int(failure["count"])
    result.filtered = int(report.get("filtered") or 0)
    result.errors = sum(int(error["count"]) for error in report.get("errors", []))
