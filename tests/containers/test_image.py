"""The sidecar image, built from the Dockerfile and run against the test cluster.

One container of ``sidecar serve`` (host network, read-only root filesystem, settings
from the environment) serves the whole module: it becomes ready, runs as uid 10001,
cannot write its root filesystem, passes its own HEALTHCHECK, and carries ordered
produce and consume across an expansion. ``sidecar inject-webhook`` from the same
image answers an AdmissionReview over TLS.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import trustme

from ordered_dev.devcluster.images import BuiltImage
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.ledger import (
    Ledger,
    check_order,
    consume_into,
    produce_sequences,
    wait_until_delivered,
)
from ordered_dev.harness.sidecars import (
    SidecarClient,
    check_no_record_crossed_a_barrier,
    unique,
)
from sidecar.inject.patch import SIDECAR_UID
from tests.containers.conftest import MEASURED
from tests.containers.support import (
    RunningContainer,
    container_settings,
    logs_of,
    run_container,
    sidecar_container,
    wait_ready,
)
from tests.ops.support import free_port
from tests.ops.test_webhook_server import (
    CONFIG,
    admission_review,
    check_injected,
    post_review,
    write_certificate,
)

HEALTHY_WITHIN_S = 120.0


@pytest.fixture(scope="module")
def container(cluster: ClusterEndpoints, sidecar_image: BuiltImage) -> Iterator[RunningContainer]:
    with sidecar_container(sidecar_image.tag, container_settings(cluster)) as running:
        MEASURED["sidecar container start to ready"] = f"{running.ready_after_s:.1f} s"
        yield running


def test_the_container_runs_as_uid_10001_on_a_read_only_root(
    container: RunningContainer,
) -> None:
    attributes = container.inspect()
    assert attributes["Config"]["User"] == f"{SIDECAR_UID}:{SIDECAR_UID}"
    assert attributes["HostConfig"]["ReadonlyRootfs"] is True
    assert attributes["HostConfig"]["NetworkMode"] == "host"
    # The serving process itself, seen from the host.
    status = Path(f"/proc/{attributes['State']['Pid']}/status").read_text()
    ids = {line.split(":")[0]: line.split()[1:] for line in status.splitlines()}
    assert ids["Uid"] == [str(SIDECAR_UID)] * 4
    assert ids["Gid"] == [str(SIDECAR_UID)] * 4
    # Nothing in the image is writable, not even by its own user.
    code, output = container.wrapped.exec_run(
        ["python", "-c", "open('/opt/ordered-sidecar/probe', 'w')"]
    )
    assert code != 0
    assert b"Read-only file system" in output


def test_the_healthcheck_reports_healthy(container: RunningContainer) -> None:
    # Docker runs the image's HEALTHCHECK every 10 s; the first run counts.
    deadline = time.monotonic() + HEALTHY_WITHIN_S
    while True:
        health = container.inspect()["State"]["Health"]
        if health["Status"] == "healthy":
            break
        assert health["Status"] == "starting", json.dumps(health, indent=2)
        assert time.monotonic() < deadline, f"still {health['Status']}:\n{container.logs()}"
        time.sleep(1.0)
    assert health["FailingStreak"] == 0
    assert health["Log"][-1]["ExitCode"] == 0


async def test_produce_and_ordered_consume_through_the_container(
    cluster: ClusterEndpoints, container: RunningContainer
) -> None:
    topic, group = unique("image-orders"), unique("image-group")
    ledger = Ledger()
    events: list[dict[str, object]] = []

    def on_events(_name: str, batch: list[dict[str, object]]) -> bool:
        events.extend(batch)
        return True

    async with aiohttp.ClientSession(container.url) as http:
        sidecar = SidecarClient(container.url, container.sidecar_id, http)
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
        consumer = asyncio.create_task(
            consume_into(sidecar, group, "app", topic, ledger, stop_consuming, on_events=on_events)
        )
        producer = asyncio.create_task(produce_sequences(sidecar, 0, topic, ledger, stop_producing))
        try:
            await asyncio.sleep(1.0)
            operation = await sidecar.change_count(topic, 4)
            assert operation["phase"] == "done", operation
            await asyncio.sleep(1.0)
            stop_producing.set()
            await producer
            await wait_until_delivered(ledger, within_s=60, diagnose=logs_of(container))
        finally:
            stop_producing.set()
            stop_consuming.set()
            await asyncio.gather(producer, consumer, return_exceptions=True)
        description = await sidecar.describe(topic)

    assert ledger.poll_errors == []
    assert [g["undeleted_count"] for g in description["generations"]] == [2, 4]
    check_order(ledger)
    await check_no_record_crossed_a_barrier(cluster, description)
    # The expansion moved keys of both old partitions into the new ones: the consumer
    # was told it lost them before it was told it got them (the gate's hand-off).
    kinds = [(event["type"], event["generation"]) for event in events]
    assert ("keys_revoked", 1) in kinds
    assert ("keys_assigned", 1) in kinds
    assert kinds.index(("keys_revoked", 1)) < kinds.index(("keys_assigned", 1))


async def test_the_inject_webhook_from_the_same_image_answers_over_tls(
    sidecar_image: BuiltImage, tmp_path_factory: pytest.TempPathFactory
) -> None:
    authority = trustme.CA()
    directory = tmp_path_factory.mktemp("webhook-tls")
    cert_path, key_path = write_certificate(authority, directory)
    # Readable by the image's user (uid 10001), as a mounted Secret is.
    directory.chmod(0o755)
    cert_path.chmod(0o644)
    key_path.chmod(0o644)
    port = free_port()
    command = [
        "inject-webhook",
        "--host=127.0.0.1",
        f"--port={port}",
        "--tls-cert=/etc/webhook/tls/tls.crt",
        "--tls-key=/etc/webhook/tls/tls.key",
        f"--image={CONFIG.image}",
        f"--admin-token-secret={CONFIG.admin_token_secret}",
    ]
    began = time.monotonic()
    handle = run_container(sidecar_image.tag, command, volumes=[(directory, "/etc/webhook/tls")])
    try:
        url = f"https://127.0.0.1:{port}"
        trusting = ssl.create_default_context()
        authority.configure_trust(trusting)
        await asyncio.to_thread(wait_ready, handle, f"{url}/healthz", began, trusting)
        MEASURED["webhook container start to ready"] = f"{time.monotonic() - began:.1f} s"
        review = admission_review({"ordered-sidecar.io/inject": "true"})
        status, answer = await post_review(url, review, trusting)
        assert status == 200
        check_injected(review, answer)
        # The server really is TLS: a client that does not trust the CA is refused.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post_review(url, review, ssl.create_default_context())
    finally:
        await asyncio.to_thread(handle.stop)
