"""``sidecar.inject.server``: the webhook's flags (``add_arguments``,
``config_from_args``), the ``inject-webhook`` command's refusals before it serves, and
the aiohttp application's answers (``/mutate``, ``/healthz``), in process.

The server on a real socket, over HTTP and HTTPS (a ``trustme`` CA, a certificate
rotated while it runs), and the ``sidecar inject-webhook`` command serving until SIGTERM
are tested in ``tests/ops/test_webhook_server.py``; from the image, in
``tests/containers/test_image.py``.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sidecar.inject import server
from sidecar.inject.patch import (
    KAFKA_SASL_MECHANISM,
    KAFKA_SASL_SECRET,
    InjectConfig,
)
from sidecar.inject.review import admit
from sidecar.inject.server import (
    MAX_REVIEW_BYTES,
    WebhookServer,
    add_arguments,
    build_webhook_app,
    config_from_args,
    run_webhook,
)
from tests.support.json_patch import apply_patch
from tests.unit.inject.support import environment, opted_in_pod, review, secret_ref, sidecar

CONFIG = InjectConfig(image="registry.example.com/ordered-sidecar:0.1.0")
LOGGER = "sidecar.inject.server"


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(flags))


# Flags -----------------------------------------------------------------------------------


def test_without_flags_the_config_has_the_inject_config_defaults() -> None:
    assert config_from_args(parse("--image", "img")) == InjectConfig(image="img")


def test_every_flag_reaches_its_setting() -> None:
    args = parse(
        "--image",
        "registry.example.com/ordered-sidecar:2.0.0",
        "--config-map",
        "orders-sidecar",
        "--admin-token-secret",
        "sidecar-admin",
        "--admin-token-key",
        "token",
        "--sidecar-port",
        "9082",
        "--sidecar-ops-port",
        "9081",
        "--cpu-request",
        "250m",
        "--memory-request",
        "64Mi",
        "--memory-limit",
        "512Mi",
        "--image-pull-policy",
        "Always",
        "--default-credential",
        f" {KAFKA_SASL_SECRET} = cluster-scram ",
    )
    assert config_from_args(args) == InjectConfig(
        image="registry.example.com/ordered-sidecar:2.0.0",
        config_map="orders-sidecar",
        admin_token_secret="sidecar-admin",
        admin_token_key="token",
        port=9082,
        ops_port=9081,
        cpu_request="250m",
        memory_request="64Mi",
        memory_limit="512Mi",
        image_pull_policy="Always",
        default_credentials=((KAFKA_SASL_SECRET, "cluster-scram"),),
    )


def test_a_default_credential_without_a_value_is_refused() -> None:
    args = parse("--image", "img", "--default-credential", KAFKA_SASL_SECRET)
    with pytest.raises(ValueError, match="expected ANNOTATION=VALUE"):
        config_from_args(args)


def test_the_webhooks_default_credentials_apply_unless_the_pod_names_its_own() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--image",
            "img",
            "--default-credential",
            f"{KAFKA_SASL_SECRET}=cluster-scram",
            "--default-credential",
            f"{KAFKA_SASL_MECHANISM}=SCRAM-SHA-256",
        ]
    )
    config = config_from_args(args)
    plain = {"ordered-sidecar.io/inject": "true"}
    for pod_annotations, secret in (
        (plain, "cluster-scram"),
        (plain | {KAFKA_SASL_SECRET: "own-scram"}, "own-scram"),
    ):
        response = admit(review(pod_annotations), config)["response"]
        operations = json.loads(base64.b64decode(response["patch"]))
        pod = apply_patch(review(pod_annotations)["request"]["object"], operations)
        env = environment(sidecar(pod))
        prefix = "ORDERED_SIDECAR__KAFKA__SECURITY__"
        assert env[f"{prefix}SASL_PASSWORD"] == secret_ref(secret, "password")
        assert env[f"{prefix}SASL_MECHANISM"] == "SCRAM-SHA-256"


# The command's refusals -------------------------------------------------------------------


@pytest.fixture
def quiet_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_webhook`` configures the process's logging: not the test process's."""
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)


@pytest.mark.usefixtures("quiet_logging")
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sidecar-port", "0"], "the sidecar port must be between 1 and 65535, got 0"),
        (["--config-map", "Not_A_Name"], "invalid ConfigMap name 'Not_A_Name'"),
        (["--default-credential", "x"], "--default-credential 'x': expected ANNOTATION=VALUE"),
        ([], "--tls-cert and --tls-key are required"),
        (["--tls-cert", "/etc/tls.crt"], "--tls-cert and --tls-key are required"),
        (["--insecure-http", "--cert-reload-s", "0"], "--cert-reload-s must be positive"),
    ],
)
def test_the_command_refuses_to_start_with_exit_code_2(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_webhook(parse("--image", "img", *flags)) == 2
    assert capsys.readouterr().err.startswith(f"sidecar inject-webhook: {message}")


def test_the_url_says_whether_the_server_speaks_tls() -> None:
    plain = WebhookServer(CONFIG, "127.0.0.1", 8443, None)
    secure = WebhookServer(CONFIG, "10.0.0.7", 8443, (Path("tls.crt"), Path("tls.key")))
    assert plain.url == "http://127.0.0.1:8443"
    assert secure.url == "https://10.0.0.7:8443"


# The application ---------------------------------------------------------------------------


def admission(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "c2b6a3f0-1d4e-4b7a-9e58-3f1a2d9c7b64",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "shop",
            "operation": "CREATE",
            "object": obj,
        },
    }


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(build_webhook_app(CONFIG))) as test_client:
        yield test_client


async def test_mutate_answers_with_the_review_of_the_body(client: TestClient[Any, Any]) -> None:
    body = admission(opted_in_pod())
    response = await client.post("/mutate", json=body)
    assert response.status == 200
    assert await response.json() == admit(body, CONFIG)


async def test_an_injection_is_logged_with_the_pods_namespace_and_name(
    client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    named = opted_in_pod()
    named["metadata"]["name"] = "orders-0"
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await client.post("/mutate", json=admission(opted_in_pod()))  # generateName only
        await client.post("/mutate", json=admission(named))
        await client.post("/mutate", json=admission({"metadata": {}, "spec": {}}))  # opted out
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "injected the sidecar into pod shop/orders-7d9c-",
        "injected the sidecar into pod shop/orders-0",
    ]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "the body is nested too deeply"),
        (b"[]", "the body must be a JSON object"),
        (b'{"kind": "Pod"}', "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview"),
        (b"{not json", "Expecting property name enclosed in double quotes"),
        (b'"\xc3\x28"', "'utf-8' codec can't decode byte 0xc3"),
    ],
)
async def test_a_body_that_is_no_review_gets_400_with_the_reason(
    client: TestClient[Any, Any], body: bytes, error: str
) -> None:
    response = await client.post("/mutate", data=body)
    assert response.status == 400
    assert error in (await response.json())["error"]


async def test_a_review_larger_than_the_limit_is_refused_unread(
    client: TestClient[Any, Any],
) -> None:
    body = admission(opted_in_pod())
    body["request"]["object"]["metadata"]["labels"] = {"padding": "x" * MAX_REVIEW_BYTES}
    response = await client.post("/mutate", data=json.dumps(body).encode())
    assert response.status == 413


async def test_healthz_answers_ok(client: TestClient[Any, Any]) -> None:
    response = await client.get("/healthz")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}


def test_a_certificate_file_missing_mid_rotation_reads_as_changed(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("c")
    key.write_text("k")
    seen = server._mtimes(cert, key)
    assert seen == (cert.stat().st_mtime, key.stat().st_mtime)
    key.unlink()
    # Differs from what was seen, so the reload is tried (and kept back on its failure).
    assert server._mtimes(cert, key) == ()
