"""The Helm chart (charts/ordered-sidecar): `helm lint --strict`, and the manifests it
renders with several value sets validated strictly against the Kubernetes schemas of
1.29 and the newest release kubernetes-validate knows (its schemas come from PyPI and
are read offline), and checked against the code: the webhook's flags build the
InjectConfig the values describe, its registration reaches its Service, cert-manager's
certificate names that Service, an injected pod is valid and finds its settings, and the
monitoring objects carry the project's alerts and dashboard unchanged.

Kinds of custom resources (cert-manager's Issuer and Certificate, prometheus-operator's
PodMonitor and PrometheusRule) have no schema in kubernetes-validate and none from a
package registry here: they are skipped by the schema check (``CUSTOM_KINDS``) and
checked field by field below instead.

helm is built from the Go module proxy by ``./run test`` into ~/.cache/ordered-sidecar.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import shutil
import subprocess
from functools import cache
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
    OPS_PORT_NAME,
    InjectConfig,
    patch_for,
)
from sidecar.inject.server import add_arguments, config_from_args
from tests.ops.support import ROOT
from tests.support.json_patch import apply_patch

CHART = ROOT / "charts" / "ordered-sidecar"
HELM_VERSION = "v3.19.0"
"""Keep in step with HELM_VERSION in ./run."""
NAMESPACE = "ordered-sidecar-system"
RELEASE = "ordered"
KUBE_VERSIONS = ["1.29.0", kubernetes_validate.utils.latest_version()]
CUSTOM_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...\n").decode()
VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "app-namespaces": [
        "--set-json",
        'sidecar.namespaces=["shop","billing"]',
        "--set",
        "sidecar.networkPolicy.enabled=true",
        "--set-json",
        'sidecar.networkPolicy.podSelector={"matchLabels":{"app.kubernetes.io/part-of":"shop"}}',
        "--set",
        "sidecar.adminTokenSecret=ordered-sidecar-admin",
        "--set",
        "sidecar.credentials.kafka-ca-secret=kafka-cluster-ca",
        "--set",
        "sidecar.credentials.kafka-sasl-secret=kafka-scram",
        "--set",
        "sidecar.credentials.kafka-sasl-mechanism=SCRAM-SHA-512",
        "--set",
        "sidecar.kafka.bootstrapServers=kafka-0.kafka.kafka.svc:9093",
        "--set",
        "sidecar.zookeeper.hosts=zookeeper.zookeeper.svc:2181",
        "--set",
        "sidecar.zookeeper.root=/ordered/shop",
        "--set-json",
        'sidecar.settings={"produce":{"hold_timeout_s":20.0},"http":{"max_connections":500}}',
        "--set",
        "image.tag=0.1.1",
    ],
    "without-cert-manager-and-monitoring": [
        "--set",
        "webhook.tls.certManager.enabled=false",
        "--set",
        "webhook.tls.secretName=webhook-tls",
        "--set",
        f"webhook.tls.caBundle={CA_BUNDLE}",
        "--set",
        "monitoring.podMonitor.enabled=false",
        "--set",
        "monitoring.prometheusRule.enabled=false",
        "--set",
        "monitoring.grafanaDashboard.enabled=false",
    ],
    "own-issuer": [
        "--set",
        "webhook.tls.certManager.issuerRef.name=company-ca",
        "--set",
        "webhook.tls.certManager.issuerRef.kind=ClusterIssuer",
        "--set",
        "monitoring.grafanaDashboard.namespace=grafana",
    ],
}


def helm_binary() -> str:
    """helm as ./run installs it; fails (never skips) without it."""
    candidates = [
        os.environ.get("ORDERED_SIDECAR_HELM", ""),
        str(Path.home() / ".cache" / "ordered-sidecar" / f"helm-{HELM_VERSION}" / "helm"),
        shutil.which("helm") or "",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail(f"helm is not installed: `./run test` builds helm {HELM_VERSION} with go install")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, check=False, timeout=120
    )


@cache
def render(value_set: str) -> tuple[dict[str, Any], ...]:
    result = helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSIONS[0],
        *VALUE_SETS[value_set],
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def find(docs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for doc in docs
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def every(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def webhook_config(docs: tuple[dict[str, Any], ...]) -> InjectConfig:
    """The InjectConfig the rendered webhook's flags give (parsed as the CLI parses them)."""
    (container,) = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "inject-webhook"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(args[1:]))


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_passes_strictly(value_set: str) -> None:
    result = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *VALUE_SETS[value_set])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_manifest_is_valid_strictly(value_set: str, version: str) -> None:
    docs = render(value_set)
    assert docs
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue  # no schema: checked by the tests below
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_catches_an_unknown_field() -> None:
    deployment = copy.deepcopy(find(render("defaults"), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[0], strict=True)


def test_the_value_sets_render_what_they_ask_for() -> None:
    kinds = {name: {doc["kind"] for doc in render(name)} for name in VALUE_SETS}
    webhook = {"ServiceAccount", "Deployment", "Service", "PodDisruptionBudget"}
    assert webhook | {"MutatingWebhookConfiguration", "Certificate", "Issuer"} <= kinds["defaults"]
    assert {"PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds["defaults"]
    assert "NetworkPolicy" not in kinds["defaults"]
    assert {"NetworkPolicy"} <= kinds["app-namespaces"]
    assert kinds["without-cert-manager-and-monitoring"] == webhook | {
        "MutatingWebhookConfiguration"
    }
    # Another issuer: only the serving certificate, no self-signed CA of the chart's.
    assert [doc["kind"] for doc in render("own-issuer") if "cert-manager" in doc["apiVersion"]] == [
        "Certificate"
    ]


def test_without_cert_manager_the_secret_and_ca_bundle_are_required() -> None:
    result = helm(
        "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSIONS[0],
        "--set", "webhook.tls.certManager.enabled=false",
    )  # fmt: skip
    assert result.returncode != 0
    assert "webhook.tls.secretName is required" in result.stderr


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_registration_reaches_the_webhook_over_tls(value_set: str) -> None:
    docs = render(value_set)
    (hook,) = find(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert (hook["failurePolicy"], hook["sideEffects"]) == ("Fail", "None")
    assert hook["admissionReviewVersions"] == ["v1"]
    assert "ordered-sidecar.io/inject" in hook["matchConditions"][0]["expression"]
    target = hook["clientConfig"]["service"]
    assert target["path"] == "/mutate"
    service = find(docs, "Service", target["name"])
    assert service["metadata"]["namespace"] == target["namespace"] == NAMESPACE
    (port,) = service["spec"]["ports"]
    assert port["port"] == target["port"]
    deployment = find(docs, "Deployment")
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = container["args"]
    assert named[port["targetPort"]] == int(args[args.index("--port") + 1])
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    pdb = find(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    # The webhook never mutates its own namespace (it must always be able to start).
    (excluded,) = hook["namespaceSelector"]["matchExpressions"]
    assert excluded["operator"] == "NotIn"
    assert {NAMESPACE, "kube-system"} <= set(excluded["values"])
    tls_secret = template["spec"]["volumes"][0]["secret"]["secretName"]
    if value_set == "without-cert-manager-and-monitoring":
        assert tls_secret == "webhook-tls"
        assert hook["clientConfig"]["caBundle"] == CA_BUNDLE
        return
    certificate = find(docs, "Certificate", target["name"])
    assert certificate["spec"]["secretName"] == tls_secret
    assert f"{target['name']}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    annotations = find(docs, "MutatingWebhookConfiguration")["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{target['name']}"
    issuer = certificate["spec"]["issuerRef"]
    if value_set == "own-issuer":
        assert (issuer["name"], issuer["kind"]) == ("company-ca", "ClusterIssuer")
    else:
        ca_issuer = find(docs, "Issuer", issuer["name"])
        ca = find(docs, "Certificate", f"{target['name']}-ca")
        assert ca["spec"]["isCA"] is True
        assert ca_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
        root = find(docs, "Issuer", ca["spec"]["issuerRef"]["name"])
        assert root["spec"]["selfSigned"] == {}


def test_the_webhook_flags_are_the_values() -> None:
    config = webhook_config(render("app-namespaces"))
    assert config.image == "registry.example.com/ordered-sidecar:0.1.1"
    assert (config.port, config.ops_port) == (8082, 8081)
    assert config.admin_token_secret == "ordered-sidecar-admin"
    assert dict(config.default_credentials) == {
        "ordered-sidecar.io/kafka-ca-secret": "kafka-cluster-ca",
        "ordered-sidecar.io/kafka-sasl-secret": "kafka-scram",
        "ordered-sidecar.io/kafka-sasl-mechanism": "SCRAM-SHA-512",
    }
    assert webhook_config(render("defaults")).image.endswith(":0.1.0")  # the appVersion


def app_pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "orders-",
            "namespace": namespace,
            "annotations": {"ordered-sidecar.io/inject": "true"},
            "labels": {"app.kubernetes.io/part-of": "shop"},
        },
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": "registry.example.com/orders-app:1.0.0"}],
        },
    }


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_an_injected_pod_is_valid_and_its_settings_load(version: str, tmp_path: Path) -> None:
    docs = render("app-namespaces")
    config = webhook_config(docs)
    for namespace in ("shop", "billing"):
        pod = apply_patch(app_pod(namespace), list(patch_for(app_pod(namespace), config)))
        kubernetes_validate.validate(pod, version, strict=True)
        (sidecar,) = pod["spec"]["initContainers"]
        assert sidecar["name"] == CONTAINER_NAME
        assert sidecar["args"] == ["serve", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"]
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == CONFIG_VOLUME)
        config_maps = [
            doc
            for doc in every(docs, "ConfigMap")
            if doc["metadata"]["name"] == volume["configMap"]["name"]
            and doc["metadata"]["namespace"] == namespace
        ]
        assert len(config_maps) == 1, f"no settings ConfigMap in {namespace}"
        path = tmp_path / f"{namespace}.toml"
        path.write_text(config_maps[0]["data"][CONFIG_FILE])
        environ = {item["name"]: item["value"] for item in sidecar["env"] if "value" in item}
        environ["ORDERED_SIDECAR__HTTP__ADMIN_TOKEN"] = "from-the-secret"
        # The security settings are another section's (kafka.security); here only the
        # rest of the settings must load.
        environ = {name: value for name, value in environ.items() if "__SECURITY__" not in name}
        settings = load_settings(path, environ)
        assert settings.kafka.bootstrap_servers == "kafka-0.kafka.kafka.svc:9093"
        assert (settings.zookeeper.hosts, settings.zookeeper.root) == (
            "zookeeper.zookeeper.svc:2181",
            "/ordered/shop",
        )
        assert (settings.http.host, settings.http.port) == ("127.0.0.1", 8082)
        assert (settings.http.ops_host, settings.http.ops_port) == ("0.0.0.0", 8081)
        assert settings.http.admin_enabled
        assert settings.http.max_connections == 500
        assert settings.produce.hold_timeout_s == 20.0
        assert (settings.log.format, settings.log.level) == ("json", "INFO")
        probes = {sidecar[kind]["httpGet"]["port"] for kind in ("startupProbe", "livenessProbe")}
        assert probes == {settings.http.ops_port}


def test_the_network_policy_admits_prometheus_to_the_operations_port_only() -> None:
    docs = render("app-namespaces")
    policies = every(docs, "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["billing", "shop"]
    for policy in policies:
        assert policy["spec"]["podSelector"] == {
            "matchLabels": {"app.kubernetes.io/part-of": "shop"}
        }
        (rule,) = policy["spec"]["ingress"]
        assert rule["ports"] == [{"port": 8081, "protocol": "TCP"}]
        assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "monitoring"
        }


def test_the_pod_monitor_scrapes_the_operations_port_as_the_alerts_job() -> None:
    monitor = find(render("defaults"), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == (OPS_PORT_NAME, "/metrics")
    assert {"targetLabel": "job", "replacement": "ordered-sidecar"} in endpoint["relabelings"]
    # The alerts select that job.
    assert 'job="ordered-sidecar"' in (ROOT / "prometheus" / "alerts.yml").read_text()


def test_the_prometheus_rule_carries_the_projects_alerts_unchanged() -> None:
    rule = find(render("defaults"), "PrometheusRule")
    alerts = yaml.safe_load((ROOT / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"] == alerts
    assert rule["spec"]["groups"]


def test_the_dashboard_config_map_carries_the_dashboard_for_grafanas_sidecar() -> None:
    dashboard = find(render("defaults"), "ConfigMap", f"{RELEASE}-ordered-sidecar-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboard["data"].values()
    expected = (ROOT / "grafana" / "dashboards" / "ordered-sidecar.json").read_text()
    assert json.loads(text) == json.loads(expected)
    moved = find(render("own-issuer"), "ConfigMap", f"{RELEASE}-ordered-sidecar-dashboard")
    assert moved["metadata"]["namespace"] == "grafana"


def test_no_pod_gets_an_api_token_and_there_is_no_rbac() -> None:
    for value_set in VALUE_SETS:
        docs = render(value_set)
        assert not {doc["kind"] for doc in docs} & {
            "Role",
            "ClusterRole",
            "RoleBinding",
            "ClusterRoleBinding",
        }
        assert find(docs, "ServiceAccount")["automountServiceAccountToken"] is False
        spec = find(docs, "Deployment")["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False


def test_the_chart_is_the_one_source_of_manifests() -> None:
    assert not (ROOT / "k8s").exists()
    # The alerts and the dashboard are the repository's files, linked, not copies.
    assert (CHART / "files" / "alerts.yml").resolve() == ROOT / "prometheus" / "alerts.yml"
    assert (CHART / "files" / "dashboard.json").resolve() == (
        ROOT / "grafana" / "dashboards" / "ordered-sidecar.json"
    )


def test_run_installs_the_helm_this_test_looks_for() -> None:
    assert f"HELM_VERSION={HELM_VERSION}\n" in (ROOT / "run").read_text()
