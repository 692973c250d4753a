"""Unit tests of the pure injection: patch_for (pod -> JSON Patch) and admit (reviews)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.config import load_settings
from sidecar.inject.patch import (
    CONFIG_VOLUME,
    CONTAINER_NAME,
    INJECT_ANNOTATION,
    InjectConfig,
    InjectionError,
    patch_for,
    sidecar_container,
)
from sidecar.inject.review import BadReview, admit
from tests.ops.support import apply_patch

CONFIG = InjectConfig(image="registry.example.com/ordered-sidecar:0.1.0")


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"generateName": "orders-7d9c-", "namespace": "shop"}
    if annotations is not None:
        metadata["annotations"] = annotations
    body: dict[str, Any] = {
        "containers": [{"name": "app", "image": "registry.example.com/orders-app:1.0.0"}]
    }
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def opted_in_pod(**spec: Any) -> dict[str, Any]:
    return pod({INJECT_ANNOTATION: "true"}, **spec)


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


# AdmissionReview -----------------------------------------------------------------------


def review(obj: dict[str, Any], *, operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": operation,
            "object": obj,
        },
    }


def test_admit_returns_the_patch_base64_encoded_with_the_request_uid() -> None:
    answer = admit(review(opted_in_pod()), CONFIG)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == patch_for(opted_in_pod(), CONFIG)


@pytest.mark.parametrize(
    "request_review",
    [
        review(pod()),
        review(opted_in_pod(), operation="UPDATE"),
        review(opted_in_pod(), kind="Deployment"),
    ],
)
def test_admit_allows_everything_else_unchanged(request_review: dict[str, Any]) -> None:
    response = admit(request_review, CONFIG)["response"]
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_admit_denies_a_pod_it_cannot_inject_with_the_reason() -> None:
    bad = pod({INJECT_ANNOTATION: "true", "ordered-sidecar.io/config-map": "-bad-"})
    response = admit(review(bad), CONFIG)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "ordered-sidecar.io/config-map" in response["status"]["message"]
    assert "patch" not in response


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}},
    ],
)
def test_admit_rejects_what_is_not_an_admission_review_v1(body: Any) -> None:
    with pytest.raises(BadReview):
        admit(body, CONFIG)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("metadata",), "a string"),
        (("metadata", "annotations"), ["a", "list"]),
        (("spec",), 7),
        (("spec", "containers"), "a string"),
        (("spec", "initContainers"), {"name": "an object"}),
        (("spec", "initContainers"), ["not an object"]),
        (("spec", "volumes"), [None]),
    ],
)
def test_a_pod_of_the_wrong_shapes_is_allowed_unchanged_with_the_reason(
    path: tuple[str, ...], value: Any
) -> None:
    bad = opted_in_pod()
    target = bad
    for field in path[:-1]:
        target = target[field]
    target[path[-1]] = value
    response = admit(review(bad), CONFIG)["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert "not injected" in response["status"]["message"]
    assert response["warnings"] == [response["status"]["message"]]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)
POD_PARTS = st.sampled_from(
    [
        ("metadata",),
        ("metadata", "annotations"),
        ("metadata", "annotations", INJECT_ANNOTATION),
        ("metadata", "annotations", "ordered-sidecar.io/config-map"),
        ("spec",),
        ("spec", "containers"),
        ("spec", "initContainers"),
        ("spec", "volumes"),
        ("spec", "containers", 0),
        ("spec", "containers", 0, "name"),
    ]
)


@given(st.lists(st.tuples(POD_PARTS, JSON), max_size=4), st.sampled_from(["CREATE", "UPDATE"]))
def test_any_pod_gets_an_admission_response_never_an_exception(
    changes: list[tuple[tuple[str | int, ...], Any]], operation: str
) -> None:
    document = opted_in_pod()
    for path, value in changes:
        target: Any = document
        for step in path[:-1]:
            try:
                target = target[step]
            except (KeyError, IndexError, TypeError):
                break
        else:
            settable = (isinstance(target, dict) and isinstance(path[-1], str)) or (
                isinstance(target, list) and isinstance(path[-1], int) and target
            )
            if settable:
                target[path[-1]] = value
    answer = admit(review(document, operation=operation), CONFIG)
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert isinstance(response["allowed"], bool)
    json.dumps(answer)  # what the server sends


@given(JSON)
def test_any_json_body_is_a_review_or_bad_review(body: Any) -> None:
    try:
        answer = admit(body, CONFIG)
    except BadReview:
        return
    assert answer["kind"] == "AdmissionReview"
