"""The webhook server, answering real AdmissionReview v1 documents over HTTP and HTTPS.

The request body below is what kube-apiserver sends for a Deployment's pod (fields as
in the admission.k8s.io/v1 AdmissionReview, the pod still without a name, only a
generateName). One test runs the `sidecar inject-webhook` command itself.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme

from sidecar.inject.patch import CONTAINER_NAME, InjectConfig, sidecar_container
from sidecar.inject.server import WebhookServer
from tests.support.json_patch import apply_patch
from tests.unit.inject.support import REVIEW

CONFIG = InjectConfig(
    image="registry.example.com/ordered-sidecar:0.1.0", admin_token_secret="ordered-sidecar-admin"
)


def admission_review(annotations: dict[str, str]) -> dict[str, Any]:
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "payments-5c7f9b6d8-",
            "namespace": "shop",
            "creationTimestamp": None,
            "labels": {"app.kubernetes.io/name": "payments", "pod-template-hash": "5c7f9b6d8"},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "payments-5c7f9b6d8",
                    "uid": "0b6e9e64-4c1c-4d2a-9d62-1f8a7d3c2b10",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access-x7k2p",
                    "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
                }
            ],
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example.com/payments-app:1.0.0",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 60,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "3f0c7e3a-8f9e-4f5e-a1d6-9a4b2c1d0e7f",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "9d1c6a2e-2b4f-4b8e-8c3a-5f6e7d8c9b0a",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


CREDENTIALS_REVIEW = REVIEW
"""An AdmissionReview for a pod whose annotations name credential Secrets."""


@asynccontextmanager
async def webhook(
    tls: tuple[Path, Path] | None = None, cert_reload_s: float = 30.0
) -> AsyncIterator[WebhookServer]:
    server = WebhookServer(CONFIG, "127.0.0.1", 0, tls, cert_reload_s=cert_reload_s)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def post_review(
    url: str, body: Any, ssl_context: ssl.SSLContext | None = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/mutate", json=body, ssl=ssl_context or True) as response,
    ):
        return response.status, await response.json()


def check_injected(review: dict[str, Any], answer: dict[str, Any]) -> None:
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == review["request"]["uid"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"]))
    patched = apply_patch(review["request"]["object"], operations)
    assert patched["spec"]["initContainers"] == [sidecar_container(CONFIG)]
    assert patched["spec"]["containers"] == review["request"]["object"]["spec"]["containers"]
    assert [v["name"] for v in patched["spec"]["volumes"]] == [
        "kube-api-access-x7k2p",
        "ordered-sidecar-config",
    ]


async def test_the_server_injects_into_an_opted_in_pod_over_http() -> None:
    review = admission_review({"ordered-sidecar.io/inject": "true"})
    async with webhook() as server:
        status, answer = await post_review(server.url, review)
    assert status == 200
    check_injected(review, answer)


async def test_the_server_injects_credentials_named_by_annotations_over_http() -> None:
    review = json.loads(CREDENTIALS_REVIEW.read_text())
    async with webhook() as server:
        status, answer = await post_review(server.url, review)
    assert status == 200
    assert answer["response"]["allowed"] is True
    operations = json.loads(base64.b64decode(answer["response"]["patch"]))
    patched = apply_patch(review["request"]["object"], operations)
    (container,) = patched["spec"]["initContainers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["ORDERED_SIDECAR__KAFKA__SECURITY__SASL_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "orders-kafka-scram", "key": "password"}
    }
    assert all(mount["readOnly"] for mount in container["volumeMounts"])


async def test_the_server_leaves_other_pods_alone_and_rejects_garbage() -> None:
    review = admission_review({"unrelated": "x"})
    async with webhook() as server:
        status, answer = await post_review(server.url, review)
        assert status == 200
        assert answer["response"] == {"uid": review["request"]["uid"], "allowed": True}
        status, error = await post_review(server.url, {"kind": "Pod"})
        assert status == 400
        assert "AdmissionReview" in error["error"]
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{server.url}/mutate", data=b"{not json") as response,
        ):
            assert response.status == 400
        async with aiohttp.ClientSession() as session, session.get(f"{server.url}/healthz") as ok:
            assert ok.status == 200


async def test_every_body_gets_a_review_or_a_400_json_error_never_a_500() -> None:
    metadata_a_string = admission_review({"ordered-sidecar.io/inject": "true"})
    metadata_a_string["request"]["object"]["metadata"] = "a string"
    containers_a_string = admission_review({"ordered-sidecar.io/inject": "true"})
    containers_a_string["request"]["object"]["spec"]["containers"] = "a string"
    deep_pod = admission_review({"ordered-sidecar.io/inject": "true"})
    deep_pod["request"]["object"]["spec"]["nested"] = json.loads("[" * 500 + "]" * 500)
    bodies: list[bytes] = [
        json.dumps(metadata_a_string).encode(),
        json.dumps(containers_a_string).encode(),
        json.dumps(deep_pod).encode(),
        b"[" * 100_000 + b"]" * 100_000,
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
        + b'{"uid": 5}}',
        b"\xff\xfe",
        b"",
        b"null",
    ]
    async with webhook() as server, aiohttp.ClientSession() as session:
        for body in bodies:
            async with session.post(f"{server.url}/mutate", data=body) as response:
                answer = await response.json(content_type=None)
            assert response.status in (200, 400), (body[:80], response.status)
            if response.status == 400:
                assert answer["error"]
                continue
            assert answer["kind"] == "AdmissionReview"
            assert answer["response"]["allowed"] is True
            if body in bodies[:2]:
                assert "not injected" in answer["response"]["status"]["message"]
                assert "patch" not in answer["response"]


async def test_the_server_speaks_https_with_the_given_certificate(tmp_path: Path) -> None:
    authority = trustme.CA()
    cert_path, key_path = write_certificate(authority, tmp_path)
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)  # what the caBundle does for kube-apiserver
    review = admission_review({"ordered-sidecar.io/inject": "true"})
    async with webhook((cert_path, key_path)) as server:
        assert server.url.startswith("https://")
        status, answer = await post_review(server.url, review, client_context)
        assert status == 200
        check_injected(review, answer)
        # A client that does not trust the CA is refused: the server really is TLS.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post_review(server.url, review, ssl.create_default_context())


async def test_the_inject_webhook_command_serves_until_sigterm() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar.cli",
        "inject-webhook",
        "--insecure-http",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--image",
        CONFIG.image,
        "--admin-token-secret",
        "ordered-sidecar-admin",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=20)).decode()
        assert line.startswith("inject-webhook ready on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        review = admission_review({"ordered-sidecar.io/inject": "true"})
        status, answer = await post_review(url, review)
        assert status == 200
        check_injected(review, answer)
        assert CONTAINER_NAME in base64.b64decode(answer["response"]["patch"]).decode()
    finally:
        if process.returncode is None:
            process.terminate()
        code = await asyncio.wait_for(process.wait(), timeout=20)
    assert code == 0


async def test_the_command_refuses_to_serve_plain_http_unless_asked() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar.cli",
        "inject-webhook",
        "--image",
        CONFIG.image,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode == 2
    assert b"--tls-cert and --tls-key are required" in stderr


def write_certificate(authority: trustme.CA, directory: Path) -> tuple[Path, Path]:
    certificate = authority.issue_cert("127.0.0.1")
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(b"".join(pem.bytes() for pem in certificate.cert_chain_pems))
    key_path.write_bytes(certificate.private_key_pem.bytes())
    return cert_path, key_path


async def test_a_rotated_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    old_authority, new_authority = trustme.CA(), trustme.CA()
    tls = write_certificate(old_authority, tmp_path)
    trusts_new = ssl.create_default_context()
    new_authority.configure_trust(trusts_new)
    review = admission_review({"ordered-sidecar.io/inject": "true"})
    async with webhook(tls, cert_reload_s=0.1) as server:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post_review(server.url, review, trusts_new)
        # What kubelet does when cert-manager renews the Secret: new files, new mtimes.
        cert_path, key_path = write_certificate(new_authority, tmp_path)
        later = time.time() + 5
        os.utime(cert_path, (later, later))
        os.utime(key_path, (later, later))
        deadline = time.monotonic() + 10
        while True:
            try:
                status, _ = await post_review(server.url, review, trusts_new)
                break
            except aiohttp.ClientConnectorCertificateError:
                assert time.monotonic() < deadline, "the new certificate was never loaded"
                await asyncio.sleep(0.1)
        assert status == 200
