"""Credentials by injection: the annotations that name Secrets, and what the webhook
makes of them (``sidecar.inject.patch.credentials_for``).

Driven through ``admit`` with an AdmissionReview as the API server sends it for a
ReplicaSet's pod (``reviews/pod-create-with-credentials.json``); the patched pod is
validated strictly against the Kubernetes schema. The environment names are the
sidecar's security settings (``kafka.security.*``, ``zookeeper.security.*``).
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from sidecar.inject.patch import (
    CONTAINER_NAME,
    KAFKA_OAUTH_SCOPE,
    KAFKA_OAUTH_SECRET,
    KAFKA_OAUTH_TOKEN_ENDPOINT,
    KAFKA_SASL_MECHANISM,
    KAFKA_SASL_SECRET,
    SECRETS_DIR,
    InjectConfig,
)
from sidecar.inject.review import admit
from sidecar.inject.server import add_arguments, config_from_args
from tests.ops.support import apply_patch

CONFIG = InjectConfig(image="registry.example.com/ordered-sidecar:0.1.0")
REVIEW = Path(__file__).with_name("reviews") / "pod-create-with-credentials.json"


def review(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(REVIEW.read_text())
    if annotations is not None:
        document["request"]["object"]["metadata"]["annotations"] = annotations
    return document


def injected(document: dict[str, Any]) -> dict[str, Any]:
    """The pod after the webhook's patch (which must be allowed and present)."""
    response = admit(document, CONFIG)["response"]
    assert response["allowed"] is True, response
    operations = json.loads(base64.b64decode(response["patch"]))
    return apply_patch(document["request"]["object"], operations)


def sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["spec"]["initContainers"] if c["name"] == CONTAINER_NAME]
    return dict(container)


def environment(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def secret_ref(name: str, key: str, *, optional: bool = False) -> dict[str, Any]:
    reference: dict[str, Any] = {"name": name, "key": key}
    if optional:
        reference["optional"] = True
    return {"secretKeyRef": reference}


def test_the_review_injects_tls_files_read_only_and_secrets_by_reference() -> None:
    pod = injected(review())
    container = sidecar(pod)
    env = environment(container)
    kafka, zookeeper = (
        "ORDERED_SIDECAR__KAFKA__SECURITY__",
        "ORDERED_SIDECAR__ZOOKEEPER__SECURITY__",
    )
    assert {name: value for name, value in env.items() if "__SECURITY__" in name} == {
        f"{kafka}PROTOCOL": "SASL_SSL",
        f"{kafka}SSL_CAFILE": f"{SECRETS_DIR}/kafka-ca/ca.crt",
        f"{kafka}SSL_CERTFILE": f"{SECRETS_DIR}/kafka-client-cert/tls.crt",
        f"{kafka}SSL_KEYFILE": f"{SECRETS_DIR}/kafka-client-cert/tls.key",
        f"{kafka}SSL_KEY_PASSWORD": secret_ref("orders-kafka-tls", "key-password", optional=True),
        f"{kafka}SASL_MECHANISM": "SCRAM-SHA-512",
        f"{kafka}SASL_USERNAME": secret_ref("orders-kafka-scram", "username"),
        f"{kafka}SASL_PASSWORD": secret_ref("orders-kafka-scram", "password"),
        f"{zookeeper}TLS": "true",
        f"{zookeeper}SSL_CAFILE": f"{SECRETS_DIR}/zookeeper-ca/ca.crt",
        f"{zookeeper}DIGEST_USERNAME": secret_ref("orders-zookeeper-digest", "username"),
        f"{zookeeper}DIGEST_PASSWORD": secret_ref("orders-zookeeper-digest", "password"),
    }
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for directory, secret, keys in (
        ("kafka-ca", "kafka-cluster-ca", ["ca.crt"]),
        ("kafka-client-cert", "orders-kafka-tls", ["tls.crt", "tls.key"]),
        ("zookeeper-ca", "zookeeper-ca", ["ca.crt"]),
    ):
        mount = mounts[f"{SECRETS_DIR}/{directory}"]
        assert mount["readOnly"] is True
        source = volumes[mount["name"]]["secret"]
        assert source["secretName"] == secret
        assert [item["key"] for item in source["items"]] == keys
        assert source["defaultMode"] == 0o444
    # The pod's own volume and the app container are untouched.
    assert "kube-api-access-7xk2p" in volumes
    assert pod["spec"]["containers"] == review()["request"]["object"]["spec"]["containers"]
    # No secret value is in the patch, only references.
    assert "password" not in json.dumps([v for v in env.values() if isinstance(v, str)])


@pytest.mark.parametrize("version", ["1.29.0", kubernetes_validate.utils.latest_version()])
def test_the_injected_pod_is_valid_strictly(version: str) -> None:
    pod = injected(review())
    pod.pop("status")
    kubernetes_validate.validate(pod, version, strict=True)


def test_oauth_comes_from_its_secret_and_annotations() -> None:
    pod = injected(
        review(
            {
                "ordered-sidecar.io/inject": "true",
                KAFKA_OAUTH_SECRET: "orders-oauth",
                KAFKA_OAUTH_TOKEN_ENDPOINT: "https://login.example.com/oauth2/token",
                KAFKA_OAUTH_SCOPE: "kafka",
            }
        )
    )
    env = environment(sidecar(pod))
    prefix = "ORDERED_SIDECAR__KAFKA__SECURITY__"
    assert {name: value for name, value in env.items() if name.startswith(prefix)} == {
        f"{prefix}PROTOCOL": "SASL_PLAINTEXT",
        f"{prefix}SASL_MECHANISM": "OAUTHBEARER",
        f"{prefix}OAUTH_TOKEN_ENDPOINT": "https://login.example.com/oauth2/token",
        f"{prefix}OAUTH_CLIENT_ID": secret_ref("orders-oauth", "client-id"),
        f"{prefix}OAUTH_CLIENT_SECRET": secret_ref("orders-oauth", "client-secret"),
        f"{prefix}OAUTH_SCOPE": "kafka",
    }


def test_a_pod_without_credential_annotations_gets_no_security_settings() -> None:
    pod = injected(review({"ordered-sidecar.io/inject": "true"}))
    assert not [name for name in environment(sidecar(pod)) if "__SECURITY__" in name]
    assert [v["name"] for v in pod["spec"]["volumes"]] == [
        "kube-api-access-7xk2p",
        "ordered-sidecar-config",
    ]


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({KAFKA_SASL_SECRET: "Not_A_Name"}, KAFKA_SASL_SECRET),
        ({KAFKA_SASL_SECRET: "s", KAFKA_SASL_MECHANISM: "GSSAPI"}, KAFKA_SASL_MECHANISM),
        ({KAFKA_SASL_MECHANISM: "PLAIN"}, KAFKA_SASL_MECHANISM),
        ({KAFKA_OAUTH_SECRET: "o"}, KAFKA_OAUTH_TOKEN_ENDPOINT),
        ({KAFKA_OAUTH_SECRET: "o", KAFKA_OAUTH_TOKEN_ENDPOINT: "http://idp/token"}, "https://"),
        ({KAFKA_OAUTH_SCOPE: "kafka"}, KAFKA_OAUTH_SCOPE),
        (
            {
                KAFKA_SASL_SECRET: "s",
                KAFKA_OAUTH_SECRET: "o",
                KAFKA_OAUTH_TOKEN_ENDPOINT: "https://x",
            },
            "exclude each other",
        ),
    ],
)
def test_unusable_credential_annotations_deny_the_pod_naming_the_annotation(
    annotations: dict[str, str], named: str
) -> None:
    document = review({"ordered-sidecar.io/inject": "true", **annotations})
    response = admit(document, CONFIG)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert named in response["status"]["message"]
    assert "patch" not in response


def test_credentials_are_injected_once() -> None:
    pod = injected(review())
    again = copy.deepcopy(review())
    again["request"]["object"] = pod
    assert "patch" not in admit(again, CONFIG)["response"]


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


@pytest.mark.parametrize(
    "credentials",
    [
        (("ordered-sidecar.io/unknown", "x"),),
        ((KAFKA_SASL_SECRET, "Bad Name"),),
        ((KAFKA_OAUTH_SECRET, "o"),),  # no token endpoint
    ],
)
def test_unusable_default_credentials_are_refused_at_start(
    credentials: tuple[tuple[str, str], ...],
) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message names the annotation
        InjectConfig(image="img", default_credentials=credentials)
