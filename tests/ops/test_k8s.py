"""The Kubernetes manifests: schema-valid (strict) for 1.29 and the newest known release,
and consistent with the code: the sidecar is a native sidecar probed on /healthz and
/readyz at the port it listens on, the ConfigMap loads as settings, the hand-written
sidecar is exactly what the webhook injects, and the webhook's wiring holds together.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubernetes_validate.utils import ValidationError  # type: ignore[import-untyped]

from sidecar.config import load_settings
from sidecar.inject.patch import (
    CONFIG_DIR,
    CONFIG_FILE,
    CONFIG_VOLUME,
    CONTAINER_NAME,
    InjectConfig,
    patch_for,
    sidecar_container,
)
from sidecar.inject.server import add_arguments, config_from_args
from tests.ops.support import K8S_DIR, apply_patch
from tests.ops.test_dockerfile import app_routes

# Native sidecars (restartPolicy on init containers) are on by default from 1.29.
VERSIONS = ["1.29.0", kubernetes_validate.utils.latest_version()]
MANIFESTS = sorted(K8S_DIR.rglob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resource(kind: str, name: str) -> dict[str, Any]:
    for path in MANIFESTS:
        for doc in documents(path):
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} under k8s/")


def container(pod_spec: dict[str, Any], name: str, *, init: bool) -> dict[str, Any]:
    key = "initContainers" if init else "containers"
    for item in pod_spec.get(key) or []:
        if item["name"] == name:
            return dict(item)
    raise AssertionError(f"no {key} entry named {name}")


def webhook_inject_config() -> InjectConfig:
    """The InjectConfig the webhook Deployment's flags produce (parsed like the CLI does)."""
    webhook = resource("Deployment", "ordered-sidecar-webhook")
    args = container(webhook["spec"]["template"]["spec"], "webhook", init=False)["args"]
    assert args[0] == "inject-webhook"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(args[1:]))


def test_there_are_manifests() -> None:
    assert len(MANIFESTS) >= 10


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(K8S_DIR)))
def test_manifest_is_valid_strictly(path: Path, version: str) -> None:
    for doc in documents(path):
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_catches_an_unknown_field() -> None:
    broken = copy.deepcopy(resource("Deployment", "orders"))
    broken["spec"]["template"]["spec"]["initContainers"][0]["restartPolicyy"] = "Always"
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_the_sidecar_is_a_native_sidecar_probed_where_it_listens() -> None:
    spec = resource("Deployment", "orders")["spec"]["template"]["spec"]
    sidecar = container(spec, CONTAINER_NAME, init=True)
    assert sidecar["restartPolicy"] == "Always"
    env = {item["name"]: item.get("value") for item in sidecar["env"]}
    port = int(env["ORDERED_SIDECAR__HTTP__OPS_PORT"])
    data_port = int(env["ORDERED_SIDECAR__HTTP__PORT"])
    assert [p["containerPort"] for p in sidecar["ports"]] == [port]
    probes = {kind: sidecar[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe")}
    probes["livenessProbe"] = sidecar["livenessProbe"]["httpGet"]
    assert probes == {
        "startupProbe": {"path": "/readyz", "port": port},
        "readinessProbe": {"path": "/readyz", "port": port},
        "livenessProbe": {"path": "/healthz", "port": port},
    }
    assert {"/readyz", "/healthz"} <= app_routes()
    # Probes and scrapes arrive on the pod IP, at the operations listener; the data
    # plane keeps its loopback default.
    assert env["ORDERED_SIDECAR__HTTP__OPS_HOST"] == "0.0.0.0"
    assert "ORDERED_SIDECAR__HTTP__HOST" not in env
    assert sidecar["resources"]["requests"]
    assert sidecar["resources"]["limits"]["memory"]
    # The app reaches its sidecar on localhost at that port.
    app = container(spec, "app", init=False)
    app_env = {item["name"]: item.get("value") for item in app["env"]}
    assert app_env["ORDERED_SIDECAR_URL"] == f"http://127.0.0.1:{data_port}"


def test_the_configmap_loads_as_the_sidecars_settings(tmp_path: Path) -> None:
    spec = resource("Deployment", "orders")["spec"]["template"]["spec"]
    sidecar = container(spec, CONTAINER_NAME, init=True)
    assert sidecar["args"] == ["serve", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"]
    mount = sidecar["volumeMounts"][0]
    assert (mount["name"], mount["mountPath"]) == (CONFIG_VOLUME, CONFIG_DIR)
    volume = next(v for v in spec["volumes"] if v["name"] == CONFIG_VOLUME)
    config_map = resource("ConfigMap", volume["configMap"]["name"])
    path = tmp_path / CONFIG_FILE
    path.write_text(config_map["data"][CONFIG_FILE])
    environ = {item["name"]: item["value"] for item in sidecar["env"] if "value" in item}
    secret_env = [item for item in sidecar["env"] if "valueFrom" in item]
    assert [item["name"] for item in secret_env] == ["ORDERED_SIDECAR__HTTP__ADMIN_TOKEN"]
    environ["ORDERED_SIDECAR__HTTP__ADMIN_TOKEN"] = "from-the-secret"
    settings = load_settings(path, environ)
    assert settings.http.host == "127.0.0.1"
    assert settings.http.ops_host == "0.0.0.0"
    assert settings.http.ops_port == sidecar["ports"][0]["containerPort"]
    assert settings.http.admin_enabled
    assert settings.zookeeper.root.startswith("/ordered")


def test_the_hand_written_sidecar_is_what_the_webhook_injects() -> None:
    spec = resource("Deployment", "orders")["spec"]["template"]["spec"]
    assert container(spec, CONTAINER_NAME, init=True) == sidecar_container(webhook_inject_config())


@pytest.mark.parametrize("version", VERSIONS)
def test_the_injected_deployment_is_valid_after_injection(version: str) -> None:
    deployment = resource("Deployment", "payments")
    template = deployment["spec"]["template"]
    config = webhook_inject_config()
    operations = patch_for(template, config)
    assert operations, "the example does not opt in"
    injected = copy.deepcopy(deployment)
    injected["spec"]["template"] = apply_patch(template, list(operations))
    kubernetes_validate.validate(injected, version, strict=True)
    spec = injected["spec"]["template"]["spec"]
    assert container(spec, CONTAINER_NAME, init=True)["image"] == config.image
    assert patch_for(injected["spec"]["template"], config) == []
    volume = next(v for v in spec["volumes"] if v["name"] == CONFIG_VOLUME)
    resource("ConfigMap", volume["configMap"]["name"])  # the ConfigMap it needs exists


def test_the_webhook_registration_matches_its_service_and_server() -> None:
    registration = resource("MutatingWebhookConfiguration", "ordered-sidecar-injector")
    (hook,) = registration["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert "ordered-sidecar.io/inject" in hook["matchConditions"][0]["expression"]
    target = hook["clientConfig"]["service"]
    assert target["path"] == "/mutate"
    service = resource("Service", target["name"])
    assert service["metadata"]["namespace"] == target["namespace"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == target["port"]
    webhook = resource("Deployment", "ordered-sidecar-webhook")
    assert webhook["metadata"]["namespace"] == target["namespace"]
    pod = webhook["spec"]["template"]
    args = container(pod["spec"], "webhook", init=False)["args"]
    assert service_port["targetPort"] == int(args[args.index("--port") + 1])
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    # The webhook never mutates its own namespace or pods (it must always start).
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn"
    assert target["namespace"] in excluded["values"]
    assert "kube-system" in excluded["values"]
    own = hook["objectSelector"]["matchExpressions"][0]
    assert own["operator"] == "NotIn"
    assert pod["metadata"]["labels"][own["key"]] in own["values"]


def test_the_metrics_service_and_network_policy_select_the_sidecar_pods() -> None:
    service = resource("Service", "ordered-sidecar-metrics")
    policy = resource("NetworkPolicy", "ordered-sidecar-ingress")
    for name in ("orders", "payments"):
        labels = resource("Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == webhook_inject_config().ops_port
    allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert webhook_inject_config().ops_port in allowed
    assert webhook_inject_config().port not in allowed


def test_no_pod_gets_an_api_token_and_there_is_no_rbac() -> None:
    kinds = {doc["kind"] for path in MANIFESTS for doc in documents(path)}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    for name in ("orders", "payments", "ordered-sidecar-webhook"):
        spec = resource("Deployment", name)["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
