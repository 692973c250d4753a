"""`sidecar devcluster install|up|down|status`: the local cluster from the command line;
`spark-up|spark-down`: a Spark standalone master and worker beside it, for the audit
jobs' `--master`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.errors import DevClusterError
from ordered_dev.devcluster.install import ensure_installed
from ordered_dev.devcluster.security import SECURITY_MODES
from ordered_dev.devcluster.spark import SparkStandalone


def default_work_dir() -> Path:
    """``var/devcluster`` in the source checkout (ignored by git)."""
    return Path(__file__).resolve().parents[2] / "var" / "devcluster"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "devcluster",
        help="a local ZooKeeper + 3-node KRaft Kafka cluster on loopback",
        description=__doc__,
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=default_work_dir(),
        help="where the cluster keeps its data, logs and cluster.json (default: %(default)s)",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("install", help="resolve the Kafka and ZooKeeper jars with Maven")
    up = actions.add_parser("up", help="start the cluster and wait until it accepts clients")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds (default: %(default)s)")
    up.add_argument(
        "--security",
        choices=SECURITY_MODES,
        default="",
        help="TLS, mutual TLS, SASL (SCRAM, PLAIN, OAUTHBEARER) and ACLs on Kafka, TLS and "
        "SASL on ZooKeeper; certificates and users are made in <dir>/security",
    )
    up.add_argument("--brokers", type=int, default=3, help="Kafka nodes (default: %(default)s)")
    actions.add_parser("down", help="stop every process this cluster started")
    actions.add_parser("status", help="print each server's pid, port and liveness as JSON")
    actions.add_parser(
        "spark-up",
        help="start a Spark standalone master and one worker (1 core, 1 GiB) on loopback, "
        "from the installed pyspark; data and logs in <dir>/spark",
    )
    actions.add_parser("spark-down", help="stop the Spark master and worker spark-up started")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except DevClusterError as exc:
        print(f"devcluster: {exc}")
        return 1


def _run(args: argparse.Namespace) -> int:
    work_dir: Path = args.dir
    if args.action == "install":
        installed = ensure_installed()
        print(f"kafka {installed.kafka_version}: {installed.kafka_libs}")
        print(f"zookeeper {installed.zookeeper_version}: {installed.zookeeper_libs}")
        return 0
    if args.action == "up":
        cluster = LocalCluster(work_dir, broker_count=args.brokers, security=args.security)
        seconds = cluster.start(timeout=args.timeout)
        print(f"cluster up in {seconds:.1f} s ({work_dir})")
        if cluster.security:
            material = cluster.material
            print(f"  kafka SASL_SSL:  {cluster.kafka_bootstrap}")
            print(f"  kafka mTLS:      {cluster.mtls_bootstrap}")
            print(f"  zookeeper TLS:   {cluster.zookeeper_tls_hosts}")
            print(f"  zookeeper:       {cluster.zookeeper_hosts} (no identity: read only)")
            print(f"  CA, certificates and passwords: {material.directory}/material.json")
            return 0
        print(f"  kafka bootstrap: {cluster.kafka_bootstrap}")
        print(f"  zookeeper:       {cluster.zookeeper_hosts}")
        return 0
    if args.action in ("spark-up", "spark-down"):
        spark = SparkStandalone(work_dir / "spark")
        if args.action == "spark-down":
            spark.stop()
            print("spark stopped")
            return 0
        seconds = spark.start()
        print(f"spark up in {seconds:.1f} s: --master {spark.master_url}")
        return 0
    cluster = LocalCluster(work_dir)
    if args.action == "down":
        cluster.stop()
        print("cluster stopped")
        return 0
    if args.action == "status":
        if cluster.state is None:
            print(f"no cluster in {work_dir}")
            return 1
        report = cluster.status()
        print(json.dumps(report, indent=2))
        return 0 if all(server["alive"] for server in report.values()) else 1
    raise AssertionError(f"unhandled action {args.action!r}")
