"""What the injection tests share: pods as the API server sends them, and the
AdmissionReview of a ReplicaSet's pod whose annotations name credential Secrets
(``reviews/pod-create-with-credentials.json``, fields as kube-apiserver sends them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sidecar.inject.patch import CONTAINER_NAME, INJECT_ANNOTATION

REVIEW = Path(__file__).with_name("reviews") / "pod-create-with-credentials.json"


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


def review(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(REVIEW.read_text())
    if annotations is not None:
        document["request"]["object"]["metadata"]["annotations"] = annotations
    return document


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
