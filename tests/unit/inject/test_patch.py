"""``sidecar.inject.patch``: which pods get the sidecar and the JSON Patch that adds it
(opt-in values, idempotence, init-container order, app containers untouched, volumes,
the ConfigMap annotation, probes on the operations port), and the credentials the
annotations name (``credentials_for``).

The credential tests drive ``admit`` with an AdmissionReview as the API server sends it
for a ReplicaSet's pod (``reviews/pod-create-with-credentials.json``); the patched pod
is validated strictly against the Kubernetes schema. The environment names are the
sidecar's security settings (``kafka.security.*``, ``zookeeper.security.*``).
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from sidecar.config import load_settings
from sidecar.inject.patch import (
    CONFIG_VOLUME,
    CONTAINER_NAME,
    INJECT_ANNOTATION,
    KAFKA_CA_SECRET,
    KAFKA_OAUTH_SCOPE,
    KAFKA_OAUTH_SECRET,
    KAFKA_OAUTH_TOKEN_ENDPOINT,
    KAFKA_SASL_MECHANISM,
    KAFKA_SASL_SECRET,
    SECRETS_DIR,
    ZOOKEEPER_CA_SECRET,
    ZOOKEEPER_CLIENT_CERT_SECRET,
    InjectConfig,
    InjectionError,
    UnpatchablePod,
    credentials_for,
    patch_for,
    sidecar_container,
)
from sidecar.inject.review import admit
from tests.support.json_patch import apply_patch
from tests.unit.inject.support import (
    environment,
    opted_in_pod,
    pod,
    review,
    secret_ref,
    sidecar,
)

CONFIG = InjectConfig(image="registry.example.com/ordered-sidecar:0.1.0")


def sidecars_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    spec = document["spec"]
    every = [*(spec.get("initContainers") or []), *spec["containers"]]
    return [container for container in every if container["name"] == CONTAINER_NAME]


@pytest.mark.parametrize("value", ["true", "True", "TRUE", " true "])
def test_opted_in_pods_get_the_sidecar(value: str) -> None:
    original = pod({INJECT_ANNOTATION: value})
    patched = apply_patch(original, list(patch_for(original, CONFIG)))
    assert sidecars_of(patched) == [sidecar_container(CONFIG)]
    assert patched["spec"]["volumes"] == [
        {"name": CONFIG_VOLUME, "configMap": {"name": CONFIG.config_map}}
    ]


@pytest.mark.parametrize(
    "annotations",
    [None, {}, {INJECT_ANNOTATION: "false"}, {INJECT_ANNOTATION: "yes"}, {INJECT_ANNOTATION: ""}],
)
def test_pods_that_do_not_opt_in_get_no_operations(annotations: dict[str, str] | None) -> None:
    assert patch_for(pod(annotations), CONFIG) == []


def test_only_the_inject_annotation_counts() -> None:
    assert patch_for(pod({"sidecar.istio.io/inject": "true"}), CONFIG) == []


def test_injection_is_idempotent() -> None:
    once = apply_patch(opted_in_pod(), list(patch_for(opted_in_pod(), CONFIG)))
    assert patch_for(once, CONFIG) == []
    assert len(sidecars_of(once)) == 1


def test_a_sidecar_written_by_hand_is_not_doubled() -> None:
    as_init = opted_in_pod(initContainers=[{"name": CONTAINER_NAME, "image": "x"}])
    as_container = opted_in_pod()
    as_container["spec"]["containers"].append({"name": CONTAINER_NAME, "image": "x"})
    assert patch_for(as_init, CONFIG) == []
    assert patch_for(as_container, CONFIG) == []


def test_existing_init_containers_keep_their_order_and_run_first() -> None:
    first = {"name": "fetch-certificates", "image": "registry.example.com/certs:1"}
    second = {"name": "migrate", "image": "registry.example.com/migrate:1"}
    original = opted_in_pod(initContainers=[first, second])
    operations = patch_for(original, CONFIG)
    assert operations[0]["path"] == "/spec/initContainers/-"
    patched = apply_patch(original, list(operations))
    assert [c["name"] for c in patched["spec"]["initContainers"]] == [
        "fetch-certificates",
        "migrate",
        CONTAINER_NAME,
    ]
    assert patched["spec"]["initContainers"][:2] == [first, second]


def test_app_containers_are_untouched_and_the_pod_is_not_mutated() -> None:
    original = opted_in_pod()
    original["spec"]["containers"].append({"name": "logger", "image": "registry.example.com/l:1"})
    frozen = copy.deepcopy(original)
    operations = patch_for(original, CONFIG)
    assert original == frozen
    assert not any(op["path"].startswith("/spec/containers") for op in operations)
    assert (
        apply_patch(original, list(operations))["spec"]["containers"]
        == frozen["spec"]["containers"]
    )


def test_existing_volumes_are_kept_and_a_same_named_one_is_not_replaced() -> None:
    data = {"name": "data", "emptyDir": {}}
    patched = apply_patch(opted_in_pod(volumes=[data]), list(patch_for(opted_in_pod(), CONFIG)))
    assert patched["spec"]["volumes"][0]["name"] == CONFIG_VOLUME  # no volumes: created
    with_data = opted_in_pod(volumes=[data])
    patched = apply_patch(with_data, list(patch_for(with_data, CONFIG)))
    assert [v["name"] for v in patched["spec"]["volumes"]] == ["data", CONFIG_VOLUME]
    own = {"name": CONFIG_VOLUME, "configMap": {"name": "my-settings"}}
    operations = patch_for(opted_in_pod(volumes=[own]), CONFIG)
    assert [op["path"] for op in operations] == ["/spec/initContainers"]


def test_the_config_map_annotation_chooses_the_settings() -> None:
    original = pod({INJECT_ANNOTATION: "true", "ordered-sidecar.io/config-map": "orders-sidecar"})
    patched = apply_patch(original, list(patch_for(original, CONFIG)))
    assert patched["spec"]["volumes"] == [
        {"name": CONFIG_VOLUME, "configMap": {"name": "orders-sidecar"}}
    ]


def test_an_invalid_config_map_annotation_is_refused() -> None:
    bad = pod({INJECT_ANNOTATION: "true", "ordered-sidecar.io/config-map": "Not A Name"})
    with pytest.raises(InjectionError, match="not a ConfigMap name"):
        patch_for(bad, CONFIG)


def test_the_sidecar_is_a_native_sidecar_probed_on_its_operations_port() -> None:
    container = sidecar_container(InjectConfig(image="img", port=9000, ops_port=9001))
    assert container["restartPolicy"] == "Always"
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": 9001}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9001}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9001}
    # Only the operations port is declared: the data plane is not reachable from outside.
    assert [port["containerPort"] for port in container["ports"]] == [9001]
    env = {item["name"]: item.get("value") for item in container["env"]}
    # No HTTP__HOST: the data plane keeps its loopback default.
    assert env == {
        "ORDERED_SIDECAR__HTTP__PORT": "9000",
        "ORDERED_SIDECAR__HTTP__OPS_HOST": "0.0.0.0",
        "ORDERED_SIDECAR__HTTP__OPS_PORT": "9001",
    }
    settings = load_settings(None, env)
    assert (settings.http.host, settings.http.port) == ("127.0.0.1", 9000)
    assert (settings.http.ops_host, settings.http.ops_port) == ("0.0.0.0", 9001)


def test_the_admin_token_comes_from_the_named_secret() -> None:
    config = InjectConfig(image="img", admin_token_secret="admin", admin_token_key="token")
    env = {item["name"]: item for item in sidecar_container(config)["env"]}
    assert env["ORDERED_SIDECAR__HTTP__ADMIN_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "admin", "key": "token"}
    }


@pytest.mark.parametrize(
    "options",
    [
        {"image": ""},
        {"image": "i", "port": 0},
        {"image": "i", "ops_port": 70000},
        {"image": "i", "port": 9000, "ops_port": 9000},
        {"image": "i", "config_map": "A_B"},
    ],
)
def test_invalid_settings_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message differs per field
        InjectConfig(**options)


@pytest.mark.parametrize(
    ("part", "value", "named"),
    [
        ("metadata", "a string", "metadata is not an object"),
        ("spec", ["a", "list"], "spec is not an object"),
        ("containers", {"name": "app"}, "spec.containers is not a list of objects"),
        ("initContainers", ["init"], "spec.initContainers is not a list of objects"),
        ("volumes", [None], "spec.volumes is not a list of objects"),
    ],
)
def test_a_part_without_a_pods_shape_is_named(part: str, value: Any, named: str) -> None:
    document = opted_in_pod()
    if part in ("metadata", "spec"):
        document[part] = value
    else:
        document["spec"][part] = value
    with pytest.raises(UnpatchablePod, match=f"^{re.escape(named)}$"):
        patch_for(document, CONFIG)


def test_null_lists_are_created_whole() -> None:
    # "add" at ".../-" needs the array to exist: a null one is replaced by a new one.
    original = opted_in_pod(initContainers=None, volumes=None)
    operations = patch_for(original, CONFIG)
    assert [(op["path"], len(op["value"])) for op in operations] == [
        ("/spec/initContainers", 1),
        ("/spec/volumes", 1),
    ]
    patched = apply_patch(original, list(operations))
    assert [c["name"] for c in patched["spec"]["initContainers"]] == [CONTAINER_NAME]


def test_tls_alone_is_the_ssl_protocol_with_the_ca_mounted() -> None:
    credentials = credentials_for({KAFKA_CA_SECRET: "kafka-cluster-ca"})
    assert credentials.env == [
        {"name": "ORDERED_SIDECAR__KAFKA__SECURITY__PROTOCOL", "value": "SSL"},
        {
            "name": "ORDERED_SIDECAR__KAFKA__SECURITY__SSL_CAFILE",
            "value": f"{SECRETS_DIR}/kafka-ca/ca.crt",
        },
    ]
    assert credentials.mounts == [
        {
            "name": "ordered-sidecar-kafka-ca",
            "mountPath": f"{SECRETS_DIR}/kafka-ca",
            "readOnly": True,
        }
    ]
    assert [volume["secret"]["secretName"] for volume in credentials.volumes] == [
        "kafka-cluster-ca"
    ]


def test_a_zookeeper_client_certificate_turns_tls_on_with_its_files() -> None:
    credentials = credentials_for({ZOOKEEPER_CLIENT_CERT_SECRET: "orders-zookeeper-tls"})
    directory = f"{SECRETS_DIR}/zookeeper-client-cert"
    assert {item["name"]: item["value"] for item in credentials.env} == {
        "ORDERED_SIDECAR__ZOOKEEPER__SECURITY__TLS": "true",
        "ORDERED_SIDECAR__ZOOKEEPER__SECURITY__SSL_CERTFILE": f"{directory}/tls.crt",
        "ORDERED_SIDECAR__ZOOKEEPER__SECURITY__SSL_KEYFILE": f"{directory}/tls.key",
    }
    (volume,) = credentials.volumes
    assert [item["key"] for item in volume["secret"]["items"]] == ["tls.crt", "tls.key"]
    # No Kafka setting: the Kafka clients keep PLAINTEXT.
    assert not [item for item in credentials.env if "__KAFKA__" in item["name"]]


def test_the_injected_settings_load_as_the_sidecars_security_settings(tmp_path: Path) -> None:
    # The names the webhook writes must be settings the sidecar knows, with values it
    # accepts: load them, with the mounted files standing in as local ones.
    credentials = credentials_for(
        {KAFKA_CA_SECRET: "kafka-cluster-ca", ZOOKEEPER_CA_SECRET: "zookeeper-ca"}
    )
    environ = {}
    for item in credentials.env:
        value = item["value"]
        if value.startswith(SECRETS_DIR):
            local = tmp_path / value.removeprefix(f"{SECRETS_DIR}/").replace("/", "_")
            local.write_text("pem")
            value = str(local)
        environ[item["name"]] = value
    settings = load_settings(None, environ)
    assert settings.kafka.security.protocol == "SSL"
    assert settings.kafka.security.ssl_cafile.endswith("kafka-ca_ca.crt")
    assert settings.zookeeper.security.tls is True
    assert settings.zookeeper.security.ssl_cafile.endswith("zookeeper-ca_ca.crt")


# Credentials ---------------------------------------------------------------------------


def injected(document: dict[str, Any]) -> dict[str, Any]:
    """The pod after the webhook's patch (which must be allowed and present)."""
    response = admit(document, CONFIG)["response"]
    assert response["allowed"] is True, response
    operations = json.loads(base64.b64decode(response["patch"]))
    return apply_patch(document["request"]["object"], operations)


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
