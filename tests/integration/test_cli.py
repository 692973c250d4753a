"""`sidecar serve` and `sidecar topics ...` as separate processes, as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from kazoo.client import KazooClient

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import unique

_SIDECAR = str(Path(sys.executable).with_name("sidecar"))
TOKEN = "cli-token"


async def _run(*args: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        _SIDECAR, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_serve_and_manage_topics_from_the_command_line(cluster: ClusterEndpoints) -> None:
    env = os.environ | {
        "ORDERED_SIDECAR__KAFKA__BOOTSTRAP_SERVERS": cluster.kafka_bootstrap,
        "ORDERED_SIDECAR__ZOOKEEPER__HOSTS": cluster.zookeeper_hosts,
        "ORDERED_SIDECAR__ZOOKEEPER__ROOT": f"/{unique('cli')}",
        "ORDERED_SIDECAR__HTTP__PORT": "0",
        "ORDERED_SIDECAR__HTTP__OPS_PORT": "0",
        "ORDERED_SIDECAR__HTTP__ADMIN_ENABLED": "true",
        "ORDERED_SIDECAR__HTTP__ADMIN_TOKEN": TOKEN,
    }
    server = await asyncio.create_subprocess_exec(
        _SIDECAR,
        "serve",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert server.stdout is not None
        line = (await asyncio.wait_for(server.stdout.readline(), 60)).decode()
        assert " ready on http://127.0.0.1:" in line, line
        url = line.rsplit(" ", 1)[1].strip()
        cli = ["topics", "--url", url, "--token", TOKEN]
        topic = unique("cli")

        code, out = await _run(
            *cli,
            "create",
            topic,
            "--partitions",
            "2",
            "--replication-factor",
            str(cluster.replication_factor),
            env=env,
        )
        assert code == 0, out
        assert json.loads(out)["undeleted_count"] == 2

        code, out = await _run(*cli, "expand", topic, "--to", "3", "--validate-only", env=env)
        assert code == 0, out
        assert "would change 2 -> 3" in out

        code, out = await _run(*cli, "expand", topic, "--to", "5", env=env)
        assert code == 0, out
        assert "changed 2 -> 5 partitions (done)" in out

        code, out = await _run(
            *cli, "shrink", topic, "--to", "4", "--delete-after", "0", "--wait-retired", env=env
        )
        assert code == 0, out
        assert "changed 5 -> 4 partitions (done)" in out
        assert "removed [4]" in out.splitlines()[-1], out

        code, out = await _run(*cli, "expand", topic, "--to", "5", env=env)
        assert code == 0, out

        code, out = await _run(*cli, "shrink", topic, "--to", "9", env=env)
        assert code == 1, out
        assert json.loads(out)["error_code"] == 42210

        code, out = await _run(*cli, "describe", topic, env=env)
        assert code == 0, out
        described = json.loads(out)
        assert [g["undeleted_count"] for g in described["generations"]] == [2, 5, 4, 5]

        code, out = await _run(
            "topics", "--url", url, "--token", "wrong", "describe", topic, env=env
        )
        assert code == 1
        assert json.loads(out)["error_code"] == 40101

        # Confirming a truncation: refused without --yes, for a topic not managed, and
        # for one whose boundaries are all intact, each in one line, with nothing written.
        code, out = await _run(*cli, "confirm-truncation", topic, env=env)
        assert code == 2, out
        assert "add --yes" in out
        code, out = await _run(*cli, "confirm-truncation", unique("nowhere"), "--yes", env=env)
        assert code == 1, out
        assert "is not managed (HTTP 404, error_code 40401)" in out, out
        code, out = await _run(*cli, "confirm-truncation", topic, "--yes", env=env)
        assert code == 1, out
        assert f"no lost boundary of {topic} awaits confirmation" in out, out
        assert "(HTTP 409, error_code 40951)" in out, out
        assert len(out.strip().splitlines()) == 1, out
        root = env["ORDERED_SIDECAR__ZOOKEEPER__ROOT"]
        zookeeper = KazooClient(hosts=cluster.zookeeper_hosts)
        await asyncio.to_thread(zookeeper.start, 30)
        try:
            assert not zookeeper.exists(f"{root}/topics/{topic}/truncations")
        finally:
            await asyncio.to_thread(zookeeper.stop)
    finally:
        server.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(server.wait(), 60) == 0
