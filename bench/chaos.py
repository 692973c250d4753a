"""Chaos: load, partition-count changes and faults through three sidecar processes.

Run from the repository root (it stops by itself)::

    .venv/bin/python -m bench.chaos --minutes 30 --seed 11 [--report PATH]

It starts its own cluster (ZooKeeper + 3 KRaft brokers, ``LocalCluster``) in a
temporary directory, because its faults kill brokers and pause ZooKeeper, and stops it
at the end. Then ``ordered_dev.harness.chaos`` (the same harness as
``tests/integration/test_chaos.py``, with the issue's ranges): three ``sidecar serve``
processes, a delete and a compacted managed topic, six producers, a callback-mode and
an events-mode consumer group, a change every 3-8 s to a random count in [2, 12] (HTTP
and CLI), and faults one at a time for ``--minutes``: sidecar SIGKILL and restart,
sidecar SIGSTOP past its session timeout (a zombie), consumer instances deleted and
created again, ZooKeeper SIGSTOP 12-16 s, broker SIGKILL and restart, callback
endpoints answering 503. The same ``--seed`` gives the same schedule. With
``--trim-every S`` the delete topic's records below what both groups committed are
deleted every S seconds (as retention would), and ``--compaction-interval`` sets how
often the sidecars fold the generations whose records are gone.

After the load: per-key order in each group, every acknowledged record delivered to
both groups within 30 s of the last fault, the key hand-off contract, stale produces
fenced, nothing written across a barrier (zombies), compaction, changes never blocked.
The report (markdown) goes to ``--report`` (default ``bench/results/chaos.md``); the
exit status is 1 if a check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.machine import kafka_line
from bench.report import RESULTS_DIR, command_line, machine_lines
from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.chaos.plan import ChaosConfig
from ordered_dev.harness.chaos.report import dump, render
from ordered_dev.harness.chaos.runner import ChaosOutcome, ChaosRun


async def run(config: ChaosConfig) -> tuple[ChaosOutcome, str]:
    with tempfile.TemporaryDirectory(prefix="chaos-cluster-") as directory:
        local = LocalCluster(Path(directory))
        try:
            took = await asyncio.to_thread(local.start, 240.0)
            cluster = ClusterEndpoints(
                "local", local.kafka_bootstrap, local.zookeeper_hosts, local.broker_count, local
            )
            print(f"cluster started in {took:.0f} s: {cluster.kafka_bootstrap}", flush=True)
            outcome = await ChaosRun(config, cluster, say=lambda t: print(t, flush=True)).run()
            return outcome, kafka_line(cluster)
        finally:
            await asyncio.to_thread(local.stop)


def main(argv: Sequence[str] | None = None) -> None:
    # ChaosConfig has slots: its defaults are read from an instance, not the class.
    defaults = ChaosConfig(seed=0, load_s=0.0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=5.0, help="length of the load phase")
    parser.add_argument("--seed", type=int, default=11, help="seed of the schedule")
    parser.add_argument(
        "--report", type=Path, default=RESULTS_DIR / "chaos.md", help="markdown report path"
    )
    parser.add_argument(
        "--history", type=Path, help="also write everything observed, as JSON, to this file"
    )
    parser.add_argument(
        "--session-timeout", type=float, default=10.0, help="zookeeper.session_timeout_s"
    )
    parser.add_argument(
        "--request-timeout-ms",
        type=int,
        default=defaults.request_timeout_ms,
        help="kafka.request_timeout_ms",
    )
    parser.add_argument(
        "--change-every",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=defaults.change_every_s,
        help="seconds between two changes, drawn in [MIN, MAX] (default: %(default)s)",
    )
    parser.add_argument(
        "--lanes", type=int, help="kafka.transaction_lanes (default: the sidecar's default)"
    )
    parser.add_argument(
        "--compaction-interval",
        type=float,
        help="changes.compaction_interval_s of every sidecar (default: the sidecar's default)",
    )
    parser.add_argument(
        "--trim-every",
        type=float,
        default=defaults.trim_every_s,
        help="seconds between two deletions of the delete topic's records below what both "
        "groups committed, as retention would (0: never; default: %(default)s)",
    )
    args = parser.parse_args(argv)
    config = ChaosConfig(
        seed=args.seed,
        load_s=args.minutes * 60,
        session_timeout_s=args.session_timeout,
        request_timeout_ms=args.request_timeout_ms,
        change_every_s=(args.change_every[0], args.change_every[1]),
        transaction_lanes=args.lanes,
        compaction_interval_s=args.compaction_interval,
        trim_every_s=args.trim_every,
    )
    header_machine = machine_lines("…")  # the load average before the cluster starts
    began = time.monotonic()
    outcome, kafka = asyncio.run(run(config))
    header = [
        *(
            line if not line.startswith("- Kafka:") else f"- Kafka: {kafka}"
            for line in header_machine
        ),
        f"- command: `{command_line('bench.chaos')}` ({time.monotonic() - began:.0f} s)",
    ]
    if args.history is not None:
        dump(outcome, args.history)
    body = render(outcome)
    text = "\n".join(["# Chaos: changes and faults under load", "", *header, "", *body, ""])
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(text)
    print(text)
    print(f"\nwritten to {args.report}")
    if not outcome.passed:
        sys.exit(1)


if __name__ == "__main__":
    main()
