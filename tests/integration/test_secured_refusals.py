"""Refused credentials, certificates and identities, on the secured cluster.

At start, ``sidecar serve`` ends with one line naming the setting and the cause (exit
status 2, no traceback, no secret); at run time a request the cluster refuses is
answered 503 with an ``error_code``, never 500, and leaves nothing in Kafka or
ZooKeeper. A ZooKeeper client without the sidecars' identity can read their znodes but
cannot write a generation, a partition mode or a lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from ordered_dev.devcluster.certificates import CertificateAuthority
from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.provider import ClusterEndpoints, secured_endpoints
from ordered_dev.devcluster.security import LIMITED_USER, STRANGER_USER
from ordered_dev.harness.sidecars import (
    running_sidecars,
    settings_environment,
    settings_for,
    unique,
)
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.config import KafkaSecuritySettings, Secret, Settings
from sidecar.core.errors import MetadataNotAuthorized
from tests.support.oauth_tokens import signed_token

IDLE_CONNECTION_MS = 1_000
"""How long the revocation test's sidecar keeps an idle Kafka connection."""


def _with_kafka(settings: Settings, **changes: object) -> Settings:
    security = dataclasses.replace(settings.kafka.security, **changes)  # type: ignore[arg-type]
    return dataclasses.replace(
        settings, kafka=dataclasses.replace(settings.kafka, security=security)
    )


def _with_zookeeper(settings: Settings, **changes: object) -> Settings:
    zookeeper = settings.zookeeper
    security = dataclasses.replace(zookeeper.security, **changes)  # type: ignore[arg-type]
    return dataclasses.replace(
        settings, zookeeper=dataclasses.replace(zookeeper, security=security)
    )


async def _serve_refused(settings: Settings) -> str:
    """Run ``sidecar serve`` with ``settings``; it must exit with status 2. Returns its
    last stderr line (its own), after checking stderr for tracebacks and secrets."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("sidecar")),
        "serve",
        env=dict(os.environ) | settings_environment(settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    text = stderr.decode(errors="replace")
    assert process.returncode == 2, f"exit {process.returncode}\n{stdout!r}\n{text}"
    assert "Traceback" not in text, text
    for secret in _secrets(settings):
        assert secret not in text, "a secret reached the log"
    last = text.strip().splitlines()[-1]
    assert last.startswith("sidecar: "), text
    return last


def _secrets(settings: Settings) -> list[str]:
    kafka, zookeeper = settings.kafka.security, settings.zookeeper.security
    values = [kafka.sasl_password, kafka.ssl_key_password, zookeeper.digest_password]
    secrets = [value.reveal() for value in values if value]
    if kafka.oauth_token_file:  # a bearer token is a credential too
        secrets.append(Path(kafka.oauth_token_file).read_text().strip())
    return secrets


def _settings(cluster: LocalCluster, identity: str = "scram", user: str = "sidecar") -> Settings:
    endpoints = secured_endpoints(cluster, identity, user=user)
    return settings_for(endpoints, f"/{unique('refused')}", "refused")


def _wrong_password(cluster: LocalCluster) -> Settings:
    return _with_kafka(_settings(cluster), sasl_password=Secret("not-the-password-1"))


def _unknown_user(cluster: LocalCluster) -> Settings:
    return _with_kafka(_settings(cluster), sasl_username="nobody")


def _system_cas_only(cluster: LocalCluster) -> Settings:
    return _with_kafka(_settings(cluster), ssl_cafile="")


def _another_host_name(cluster: LocalCluster) -> Settings:
    settings = _settings(cluster)
    bootstrap = cluster.kafka_bootstrap.replace("127.0.0.1", "localhost")
    return dataclasses.replace(
        settings, kafka=dataclasses.replace(settings.kafka, bootstrap_servers=bootstrap)
    )


def _expired_client_certificate(cluster: LocalCluster) -> Settings:
    expired = cluster.material.expired
    return _with_kafka(
        _settings(cluster, "mtls"),
        ssl_certfile=str(expired.certfile),
        ssl_keyfile=str(expired.keyfile),
        ssl_key_password=Secret(""),
    )


def _untrusted_client_certificate(cluster: LocalCluster) -> Settings:
    other = CertificateAuthority("another CA").issue(
        Path(cluster.material.directory) / "other-ca", "sidecar", server=False
    )
    return _with_kafka(
        _settings(cluster, "mtls"),
        ssl_certfile=str(other.certfile),
        ssl_keyfile=str(other.keyfile),
        ssl_key_password=Secret(""),
    )


def _wrong_key_password(cluster: LocalCluster) -> Settings:
    return _with_kafka(_settings(cluster, "mtls"), ssl_key_password=Secret("not-the-password-2"))


def _missing_file(cluster: LocalCluster) -> Settings:
    return _with_kafka(_settings(cluster), ssl_cafile="/nonexistent/ca.pem")


def _oauth_token_for_another_audience(cluster: LocalCluster) -> Settings:
    # Kafka answers such a token with an error challenge, not an error code: the
    # sidecar used to take it for accepted and wait for metadata forever.
    token_file = Path(cluster.material.directory) / f"{unique('token')}.jwt"
    token_file.write_text(signed_token(cluster, audience="billing"))
    settings = _settings(cluster)
    security = KafkaSecuritySettings(
        protocol="SASL_SSL",
        ssl_cafile=cluster.material.ca,
        sasl_mechanism="OAUTHBEARER",
        oauth_token_file=str(token_file),
    )
    return dataclasses.replace(
        settings, kafka=dataclasses.replace(settings.kafka, security=security)
    )


def _principal_without_acls(cluster: LocalCluster) -> Settings:
    return _settings(cluster, user=STRANGER_USER)


def _zookeeper_wrong_password(cluster: LocalCluster) -> Settings:
    return _with_zookeeper(_settings(cluster), digest_password=Secret("not-the-password-3"))


def _zookeeper_system_cas_only(cluster: LocalCluster) -> Settings:
    return _with_zookeeper(_settings(cluster), ssl_cafile="")


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (_wrong_password, "kafka.security.sasl_username / kafka.security.sasl_password: "),
        (_unknown_user, "kafka.security.sasl_username / kafka.security.sasl_password: "),
        (_system_cas_only, "kafka.security.ssl_cafile: the certificate of broker"),
        (_another_host_name, "kafka.security.ssl_check_hostname: "),
        (_expired_client_certificate, "kafka.security.ssl_certfile: the certificate in"),
        (_untrusted_client_certificate, "kafka.security.ssl_certfile: broker"),
        (_wrong_key_password, "kafka.security.ssl_keyfile: cannot use"),
        (_missing_file, "kafka.security.ssl_cafile: /nonexistent/ca.pem does not exist"),
        (
            _oauth_token_for_another_audience,
            "kafka.security.oauth_token_file: Kafka refused the OAUTHBEARER token "
            "(the token has aud 'billing'",
        ),
        (_principal_without_acls, "not authorized"),
        (_zookeeper_wrong_password, "zookeeper.security.digest_username / digest_password"),
        (_zookeeper_system_cas_only, "zookeeper.security.ssl_cafile: "),
    ],
    ids=lambda value: getattr(value, "__name__", "").strip("_") or None,
)
async def test_a_refused_identity_stops_the_start_with_one_line(
    secured_cluster: LocalCluster, make: Callable[[LocalCluster], Settings], expected: str
) -> None:
    line = await _serve_refused(make(secured_cluster))
    assert expected in line, line


async def _kafka_topic_exists(
    endpoints: ClusterEndpoints, cluster: LocalCluster, topic: str
) -> bool:
    admin = AIOKafkaAdminClient(
        bootstrap_servers=cluster.kafka_bootstrap, **cluster.admin_client_arguments()
    )
    await admin.start()
    try:
        return topic in await admin.list_topics()
    finally:
        await admin.close()


async def test_a_topic_without_acls_is_refused_with_503_and_nothing_left(
    secured_cluster: LocalCluster,
) -> None:
    endpoints = secured_endpoints(secured_cluster, "scram", user=LIMITED_USER)
    denied, unmanaged, granted = unique("denied"), unique("denied-plain"), unique("granted")
    admin = AIOKafkaAdminClient(
        bootstrap_servers=secured_cluster.kafka_bootstrap,
        **secured_cluster.admin_client_arguments(),
    )
    await admin.start()
    try:
        await admin.create_topics([NewTopic(unmanaged, 1, 1)])
    finally:
        await admin.close()
    async with running_sidecars(endpoints, 1) as (sidecar,):
        root = sidecar.server.settings.zookeeper.root
        # What the principal may use works: the refusals below are the ACLs'.
        assert (await sidecar.create_topic(granted, 2, replication_factor=1))["generation"] == 0
        status, body = await sidecar.produce(granted, [{"key": "k", "value": 1}])
        assert status == 200, body
        assert body["offsets"][0]["error_code"] is None, body

        status, body = await sidecar.admin(
            "POST", "/admin/topics", {"name": denied, "partitions": 2, "replication_factor": 1}
        )
        assert status == 503, body
        assert body["error_code"] == 50371, body
        assert "not allowed by Kafka's ACLs" in body["message"], body

        status, body = await sidecar.produce(unmanaged, [{"key": "k", "value": 1}])
        assert status == 503, body
        assert body["error_code"] == 50371, body

    assert not await _kafka_topic_exists(endpoints, secured_cluster, denied)
    zookeeper = KazooClient(hosts=secured_cluster.zookeeper_hosts)
    await asyncio.to_thread(zookeeper.start, 15)
    try:
        assert zookeeper.exists(f"{root}/topics/{denied}") is None
        assert zookeeper.exists(f"{root}/ops/{denied}") is None
        assert zookeeper.exists(f"{root}/locks/{denied}") is None
    finally:
        await asyncio.to_thread(zookeeper.stop)
    reader = AIOKafkaConsumer(
        bootstrap_servers=secured_cluster.kafka_bootstrap,
        **secured_cluster.admin_client_arguments(),
    )
    await reader.start()
    try:
        ends = await reader.end_offsets([TopicPartition(unmanaged, 0)])
        assert ends[TopicPartition(unmanaged, 0)] == 0, "a refused record was written"
    finally:
        await reader.stop()


async def test_zookeeper_refuses_writes_without_the_sidecars_identity(
    secured_cluster: LocalCluster,
) -> None:
    endpoints = secured_endpoints(secured_cluster, "scram")
    topic = unique("guarded")
    async with running_sidecars(endpoints, 1) as (sidecar,):
        root = sidecar.server.settings.zookeeper.root
        await sidecar.create_topic(topic, 2, replication_factor=1)
        outsider = KazooClient(hosts=secured_cluster.zookeeper_hosts)
        await asyncio.to_thread(outsider.start, 15)
        try:
            topic_node = f"{root}/topics/{topic}"
            state, _ = outsider.get(topic_node)  # reading is allowed
            assert json.loads(state)["current_generation"] == 0
            modes, _ = outsider.get(f"{topic_node}/partitions")
            attempts = {
                "a generation": lambda: outsider.create(
                    f"{topic_node}/generations/{1:010d}", b'{"undeleted_count": 1}'
                ),
                "the current generation": lambda: outsider.set(
                    topic_node,
                    state.replace(b'"current_generation": 0', b'"current_generation": 1'),
                ),
                "a partition mode": lambda: outsider.set(
                    f"{topic_node}/partitions", modes.replace(b"read_write", b"removed", 1)
                ),
                "the change lock": lambda: outsider.create(f"{root}/locks/{topic}", b"{}"),
                "a journal": lambda: outsider.create(f"{root}/ops/{topic}-x", b"{}"),
            }
            refused = []
            for what, attempt in attempts.items():
                try:
                    await asyncio.to_thread(attempt)
                except NoAuthError:
                    refused.append(what)
            assert refused == list(attempts), "an unauthenticated client wrote to the metadata"
            assert outsider.get(topic_node)[0] == state
            assert outsider.exists(f"{root}/locks/{topic}") is None
        finally:
            await asyncio.to_thread(outsider.stop)

        # The store itself, without the identity, says so instead of failing with a 500.
        store = MetadataStore(secured_cluster.zookeeper_hosts, root=root)
        await store.start()
        try:
            with pytest.raises(MetadataNotAuthorized, match="ACLs do not let"):
                await store.register_sidecar("outsider", {}, ())
        finally:
            await store.stop()
        description = await sidecar.describe(topic)
        assert description["generation"] == 0, description


async def _end_offsets(cluster: LocalCluster, topic: str, count: int) -> list[int]:
    """High watermarks: whatever was appended, committed or not."""
    reader = AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap, **cluster.admin_client_arguments()
    )
    await reader.start()
    try:
        partitions = [TopicPartition(topic, partition) for partition in range(count)]
        ends = await reader.end_offsets(partitions)
        return [ends[tp] for tp in partitions]
    finally:
        await reader.stop()


async def _znodes(cluster: LocalCluster, root: str) -> dict[str, bytes]:
    """Every znode under ``root`` with its data (read without an identity: allowed)."""
    zookeeper = KazooClient(hosts=cluster.zookeeper_hosts)
    await asyncio.to_thread(zookeeper.start, 15)

    def walk(path: str) -> dict[str, bytes]:
        data, _ = zookeeper.get(path)
        tree = {path: data}
        for child in zookeeper.get_children(path):
            tree |= walk(f"{path}/{child}")
        return tree

    try:
        return await asyncio.to_thread(walk, root)
    finally:
        await asyncio.to_thread(zookeeper.stop)


async def test_credentials_revoked_at_run_time_are_refused_with_503_and_nothing_written(
    secured_cluster: LocalCluster,
) -> None:
    # Kafka checks a SCRAM credential when a connection is made: connections made before
    # the credential went keep working. This sidecar drops idle connections after a
    # second (kafka.client.connections_max_idle_ms), so its next produce connects again,
    # as any sidecar's does after a broker restart or a network cut.
    user, password = unique("revocable"), secrets.token_urlsafe(12)
    prefix = f"{user}-"
    await asyncio.to_thread(secured_cluster.set_scram_credential, user, password)
    await asyncio.to_thread(
        secured_cluster.grant_acls,
        f"User:{user}",
        f"topic:prefixed:{prefix}",
        "group:literal:*",
        "transactional_id:literal:*",
        "cluster:literal:kafka-cluster:idempotent_write",
    )
    security = dataclasses.replace(
        secured_endpoints(secured_cluster, "scram").kafka_security,
        sasl_username=user,
        sasl_password=Secret(password),
    )
    endpoints = dataclasses.replace(
        secured_endpoints(secured_cluster, "scram"), kafka_security=security
    )
    topic = f"{prefix}orders"
    async with running_sidecars(
        endpoints, 1, kafka_client={"connections_max_idle_ms": IDLE_CONNECTION_MS}
    ) as (sidecar,):
        root = sidecar.server.settings.zookeeper.root
        await sidecar.create_topic(topic, 2, replication_factor=1)
        status, body = await sidecar.produce(topic, [{"key": "k", "value": 1}])
        assert status == 200, body
        assert body["offsets"][0]["error_code"] is None, body
        ends_before = await _end_offsets(secured_cluster, topic, 2)
        znodes_before = await _znodes(secured_cluster, root)

        await asyncio.to_thread(secured_cluster.set_scram_credential, user, None)
        await asyncio.sleep(3 * IDLE_CONNECTION_MS / 1000)  # every connection dropped

        status, body = await sidecar.produce(topic, [{"key": "k", "value": 2}])
        assert status == 503, body
        assert body["error_code"] == 50370, body
        assert body["message"].startswith(
            "kafka.security.sasl_username / kafka.security.sasl_password: Kafka refused the "
            f"SCRAM-SHA-512 credentials of {user!r}"
        ), body
        assert password not in json.dumps(body)
        # The requests after it are refused at once, not after waiting for a transaction
        # that cannot begin (twice the request timeout).
        began = time.monotonic()
        status, body = await sidecar.produce(topic, [{"key": "k", "value": 3}])
        assert (status, body["error_code"]) == (503, 50370), body
        request_timeout_s = sidecar.server.settings.kafka.request_timeout_ms / 1000
        assert time.monotonic() - began < request_timeout_s, "the next request waited"

        assert await _end_offsets(secured_cluster, topic, 2) == ends_before, "records appended"
        znodes_after = await _znodes(secured_cluster, root)
        changed = {
            path
            for path in znodes_before.keys() | znodes_after.keys()
            if znodes_before.get(path) != znodes_after.get(path)
        }
        assert not changed, f"ZooKeeper changed: {sorted(changed)}"

        # The credential back: the sidecar writes again without a restart.
        await asyncio.to_thread(secured_cluster.set_scram_credential, user, password)
        deadline = time.monotonic() + 60
        while True:
            status, body = await sidecar.produce(topic, [{"key": "k", "value": 4}])
            if status == 200 and body["offsets"][0]["error_code"] is None:
                break
            assert time.monotonic() < deadline, f"still refused after 60 s: {body}"
            await asyncio.sleep(0.5)
