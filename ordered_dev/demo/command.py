"""`sidecar demo` (`./run demo`): the product end to end on this machine, in about three
minutes once installed.

1. starts ZooKeeper and a 3-node KRaft Kafka cluster on 127.0.0.1 (``var/demo/cluster``),
   or uses a running one (``--kafka`` and ``--zookeeper``);
2. starts three ``sidecar serve`` processes on one ZooKeeper root (free loopback ports,
   admin API on with a random token, audit events to a fresh audit topic) and, when the
   ``prometheus`` binary is installed, a Prometheus scraping them every second;
3. creates a managed topic of 4 partitions; three producers, one per sidecar, send keyed
   records with per-key sequence numbers over HTTP (REST Proxy v2); an ordered consumer
   group of three instances, one per sidecar, reads them with key hand-off callbacks to
   a loopback app the demo runs;
4. under that load expands the topic to 6 partitions with the CLI and shrinks it to 5
   with the admin API, printing a progress line every second;
5. prints a summary (records, keys moved against ``hash % N``, produce holds, gate
   waits, hand-off events) and checks per-key order itself: every key's records must be
   delivered in the order produced (duplicates allowed and counted);
6. runs the audit job (``sidecar audit run``, PySpark) over the run's audit events, with
   the demo's Prometheus when there is one, and prints the report's and charts' paths.

Everything the demo started is stopped at the end, also on Ctrl-C or failure, unless
``--keep`` is given: then it prints the URLs and commands to try, and
``sidecar demo --stop`` stops it all. Exit status: 0 when the order check passed and
every step ran, 1 when the order check failed, 2 when a step failed, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

from ordered_dev.demo import scenario, summary
from ordered_dev.demo.processes import (
    STATE_FILE,
    DemoError,
    DemoState,
    Started,
    alive,
    run_audit,
    start_prometheus,
    start_sidecar,
    stop,
    tail,
)
from ordered_dev.devcluster.cli import default_work_dir
from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.errors import DevClusterError
from sidecar.config import AuditSettings, HttpSettings, KafkaSettings, Settings, ZooKeeperSettings

SIDECARS = 3


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the product end to end: a cluster, 3 sidecars, load, an expansion and a shrink",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=default_work_dir().parent / "demo",
        help="the cluster (unless --dir), logs, audit output, demo.json (default: %(default)s)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        help="a local cluster's directory to use as it is (e.g. var/devcluster); default: "
        "the demo's own, WORK_DIR/cluster, started afresh by each run",
    )
    parser.add_argument("--keep", action="store_true", help="leave everything running")
    parser.add_argument("--stop", action="store_true", help="stop what --keep left running")
    parser.add_argument(
        "--quick", action="store_true", help="a few seconds of load per step (for tests)"
    )
    parser.add_argument("--no-audit", action="store_true", help="skip the audit job")
    parser.add_argument(
        "--no-prometheus", action="store_true", help="do not start Prometheus even if installed"
    )
    parser.add_argument(
        "--kafka", metavar="BOOTSTRAP", help="use this running Kafka (with --zookeeper)"
    )
    parser.add_argument(
        "--zookeeper", metavar="HOSTS", help="use this running ZooKeeper (with --kafka)"
    )
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.set_defaults(handler=run)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    work_dir: Path = args.work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    if args.stop:
        return asyncio.run(stop_everything(work_dir))
    if bool(args.kafka) != bool(args.zookeeper):
        print("demo: --kafka and --zookeeper go together", file=sys.stderr)
        return 2
    previous = DemoState.load(work_dir)
    if previous is not None and any(alive(p) for p in previous.processes):
        print(
            f"demo: a demo left running with --keep is still up ({work_dir / STATE_FILE}); "
            "stop it first: ./run demo --stop",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # stop everything on SIGTERM as on Ctrl-C
    began = time.monotonic()
    steps: dict[str, float] = {}
    cluster: LocalCluster | None = None
    state: DemoState | None = None
    code, keep = 2, False
    try:
        if args.kafka:
            state = DemoState(None, args.kafka, args.zookeeper)
            print(f"cluster: using kafka {args.kafka}, zookeeper {args.zookeeper}")
        else:
            cluster_dir = (args.dir or work_dir / "cluster").resolve()
            cluster = LocalCluster(cluster_dir)
            servers = cluster.status() if cluster.state is not None else {}
            running = bool(servers) and all(server["alive"] for server in servers.values())
            if args.dir is None and not any(server["alive"] for server in servers.values()):
                # The demo's own cluster, stopped: start it afresh on ports free now. A
                # stopped cluster restarts on the ports it had, which on a busy machine
                # another program may hold by now.
                shutil.rmtree(cluster_dir, ignore_errors=True)
                cluster = LocalCluster(cluster_dir)
            print(
                f"cluster: {'using the running' if running else 'starting a'} local cluster in "
                f"{cluster_dir} (ZooKeeper + 3 KRaft Kafka nodes on 127.0.0.1)",
                flush=True,
            )
            seconds = cluster.start(timeout=240.0)
            # A cluster that was up before the demo is left up after it, unless an
            # earlier demo started it (and left it running with --keep).
            owned = not running or (
                previous is not None and previous.cluster_dir == str(cluster_dir)
            )
            state = DemoState(
                str(cluster_dir) if owned else None,
                cluster.kafka_bootstrap,
                cluster.zookeeper_hosts,
            )
            print(
                f"cluster up in {seconds:.1f} s: kafka {cluster.kafka_bootstrap}, "
                f"zookeeper {cluster.zookeeper_hosts}"
            )
        steps["cluster"] = time.monotonic() - began
        state.save(work_dir)
        code, keep = asyncio.run(demo(args, state, work_dir, steps))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: stopping everything the demo started", flush=True)
        code = 130
    except (DemoError, DevClusterError) as exc:
        print(f"demo: {exc}", flush=True)
        code = 2
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the cleanup finish
        if not keep:
            stop_began = time.monotonic()
            if state is not None:
                asyncio.run(stop(state.processes))  # any the demo could not stop itself
            if cluster is not None and state is not None and state.cluster_dir is not None:
                cluster.stop()
                print("cluster stopped")
            (work_dir / STATE_FILE).unlink(missing_ok=True)
            steps["stop"] = steps.get("stop", 0.0) + time.monotonic() - stop_began
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    elapsed = time.monotonic() - began
    breakdown = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in steps.items())
    print(f"\ndemo took {elapsed:.0f} s ({breakdown}); exit status {code}")
    return code


def _settings(index: int, state: DemoState, root: str, token: str, audit_topic: str) -> Settings:
    """A demo sidecar: the defaults (timing included), a free port, admin on, audit on."""
    return Settings(
        sidecar_id=f"demo-{index}-{uuid.uuid4().hex[:6]}",
        kafka=KafkaSettings(bootstrap_servers=state.kafka),
        zookeeper=ZooKeeperSettings(hosts=state.zookeeper, root=root),
        http=HttpSettings(port=0, ops_port=0, admin_enabled=True, admin_token=token),
        audit=AuditSettings(enabled=True, topic=audit_topic),
    ).validate()


async def demo(
    args: argparse.Namespace, state: DemoState, work_dir: Path, steps: dict[str, float]
) -> tuple[int, bool]:
    """Sidecars, load and changes, summary, audit; (exit status, left running)."""
    main = asyncio.current_task()
    assert main is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    console = scenario.Console()
    say = console.say
    plan = scenario.QUICK if args.quick else scenario.FULL
    suffix = uuid.uuid4().hex[:6]
    topic, group = f"demo-orders-{suffix}", f"demo-group-{suffix}"
    audit_topic, root = f"demo-audit-{suffix}", f"/ordered-demo-{suffix}"
    state.topic, state.token = topic, secrets.token_hex(16)
    keep = False
    window_start = time.time()
    try:
        began = time.monotonic()
        say(f"starting {SIDECARS} sidecars (ZooKeeper root {root}, audit topic {audit_topic})")
        results = await asyncio.gather(
            *(
                start_sidecar(
                    f"sidecar-{i}",
                    _settings(i, state, root, state.token, audit_topic),
                    work_dir,
                )
                for i in range(1, SIDECARS + 1)
            ),
            return_exceptions=True,
        )
        sidecars = [r for r in results if isinstance(r, Started)]
        state.processes += sidecars
        state.save(work_dir)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        for s in sidecars:
            say(f"  {s.name}  {s.url}  pid {s.pid}  log {s.log}")
        prometheus: Started | None = None
        if not args.no_prometheus:
            prometheus = await start_prometheus([s.url.split("//")[1] for s in sidecars], work_dir)
        if prometheus is not None:
            state.processes.append(prometheus)
            state.save(work_dir)
            say(f"  prometheus {prometheus.url} scrapes them every second")
        else:
            say("  (no Prometheus: the audit runs without its figures)")
        steps["sidecars"] = time.monotonic() - began

        began = time.monotonic()
        clients, close = await scenario.sidecar_clients(
            [(s.name, s.url) for s in sidecars], state.token
        )
        try:
            outcome = await scenario.run(
                clients, topic, group, plan, args.replication_factor, console
            )
        finally:
            await close()
        window_end = time.time() + 1.0
        drain = 0.0 if math.isnan(outcome.drain_s) else outcome.drain_s
        steps["topic and group"] = time.monotonic() - began - outcome.load_s - drain
        steps["load"] = outcome.load_s
        steps["drain"] = drain

        ledger = outcome.ledger
        check = summary.check_order(ledger.delivered, ledger.acknowledged)
        figures = [summary.figures(c, ledger, topic) for c in outcome.changes]
        print()
        for line in summary.render_summary(ledger, check, figures, topic):
            print(line)
        agree, written = summary.default_agreement(ledger.placement, plan.initial_count)
        print(
            f"  routing check    generation 0 ({plan.initial_count} partitions, the initial "
            f"count) put {agree} of {written} keys where Kafka's default partitioner does"
        )
        modes = ", ".join(
            f"p{p['partition']} {p['mode']}" for p in outcome.description["partitions"]
        )
        print(f"  partitions now   {modes}")
        code = 0 if check.verified else 1
        if any(not c.done for c in outcome.changes):
            print("  a partition-count change did not complete (see above)")
            code = max(code, 2)

        if not args.no_audit:
            began = time.monotonic()
            audit_code = await _audit(
                state,
                audit_topic,
                window_start,
                window_end,
                work_dir / f"audit-{suffix}",
                prometheus,
                console,
            )
            steps["audit"] = time.monotonic() - began
            if audit_code != 0:
                code = max(code, 2)

        if args.keep:
            _print_keep(state, sidecars, prometheus, topic)
            keep = True
        return code, keep
    finally:
        if not keep:
            began = time.monotonic()
            await stop(state.processes)
            steps["stop"] = time.monotonic() - began
            if state.processes:
                say(f"stopped {', '.join(p.name for p in state.processes)}")


async def _audit(
    state: DemoState,
    audit_topic: str,
    start: float,
    end: float,
    out: Path,
    prometheus: Started | None,
    console: scenario.Console,
) -> int:
    print()
    print(
        f"Audit: sidecar audit run --bootstrap ... --topic {audit_topic} --out {out}"
        + (f" --prometheus {prometheus.url}" if prometheus else " (no Prometheus)")
    )
    code, log = await run_audit(
        bootstrap=state.kafka,
        topic=audit_topic,
        start=start,
        end=end,
        out=out,
        prometheus=prometheus.url if prometheus else None,
        say=lambda line: console.say(f"  | {line}"),
    )
    if code != 0:
        print(f"  the audit job failed (status {code}); the end of {log}:\n{tail(log)}")
        return code
    print_audit(out)
    return 0


def print_audit(out: Path) -> None:
    """The audit's findings, from its summary.json, and where its report and charts are."""
    result: dict[str, Any] = json.loads((out / "summary.json").read_text())
    anomalies = result["anomalies"]
    kinds = ", ".join(f"{k} {n}" for k, n in anomalies["by_kind"].items() if n) or "none"
    causes = anomalies["duplicates_by_cause"]
    print(f"  events           {result['events']['total']:,} in the window")
    print(
        f"  anomalies        {kinds}"
        + (
            f" (duplicates by cause: {', '.join(f'{c} {n}' for c, n in causes.items())}; "
            "delivery is at-least-once)"
            if causes
            else ""
        )
    )
    for op in result["operations"]:
        figures = [
            f"barrier {_s(op['barrier_s'])}",
            f"longest produce pause {_s(op['ack_gap_s'])}",
            f"keys moved {op['keys_moved']} of {op['keys_seen_in_both']}",
            f"violations {op['violations']}",
        ]
        if op.get("hold_max_s") is not None:
            figures.append(f"longest hold <= {_s(op['hold_max_s'])}")
        if op.get("gate_wait_max_s") is not None:
            figures.append(f"longest gate stall <= {_s(op['gate_wait_max_s'])}")
        print(f"  {op['kind']} {op['from_count']} -> {op['target_count']}: {', '.join(figures)}")
    print(f"  report           {out / 'report.md'}")
    charts = sorted(out.glob("*.png"))
    print(f"  charts           {', '.join(str(c) for c in charts) or 'none'}")


def _s(value: float | None) -> str:
    return "-" if value is None else summary.seconds(float(value))


def _print_keep(
    state: DemoState, sidecars: list[Started], prometheus: Started | None, topic: str
) -> None:
    first = sidecars[0].url
    print("\nLeft running (--keep):")
    for s in sidecars:
        print(f"  {s.name}  {s.url}  (pid {s.pid}, log {s.log})")
    if prometheus is not None:
        print(f"  prometheus {prometheus.url}")
    print(f"  kafka      {state.kafka}")
    print(f"  zookeeper  {state.zookeeper}")
    print(f"  admin token {state.token}")
    print("Try:")
    print(f"  curl -s {first}/readyz")
    print(
        f"  curl -s -XPOST {first}/topics/{topic} "
        "-H 'Content-Type: application/vnd.kafka.json.v2+json' "
        '-d \'{"records": [{"key": "p1-k1", "value": {"hello": "world"}}]}\''
    )
    print(f"  curl -s -H 'Authorization: Bearer {state.token}' {first}/admin/topics/{topic}")
    print(f"  ./run topics --url {first} --token {state.token} expand {topic} --to 8")
    print(f"  curl -s {first}/metrics | grep -E '^sidecar_(produce_hold|gate_wait)_seconds_count'")
    if prometheus is not None:
        print(f"  a browser on {prometheus.url}/graph?g0.expr=sidecar_topic_undeleted_partitions")
    print("Stop it all:  ./run demo --stop")


async def stop_everything(work_dir: Path) -> int:
    """``--stop``: the processes ``demo.json`` records, and the cluster the demo started."""
    state = DemoState.load(work_dir)
    if state is None:
        print(f"nothing to stop: no {work_dir / STATE_FILE}")
        return 0
    await stop(state.processes)
    for process in state.processes:
        print(f"stopped {process.name} (pid {process.pid})")
    if state.cluster_dir is not None:
        LocalCluster(Path(state.cluster_dir)).stop()
        print(f"stopped the cluster in {state.cluster_dir}")
    (work_dir / STATE_FILE).unlink(missing_ok=True)
    return 0
