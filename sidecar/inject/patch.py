"""What to add to a pod that opts in to an ordered-sidecar: pure, no I/O.

A pod opts in with the annotation ``ordered-sidecar.io/inject: "true"`` (the value
"true" in any case; anything else, or no annotation, opts out). The sidecar is added as
a *native sidecar* (Kubernetes 1.29+): an init container with ``restartPolicy: Always``.
Rules the operations follow:

* It is appended after the pod's own init containers, which keep their order and run
  first (one may fetch the Kafka client certificate the sidecar needs). Kubernetes then
  starts the app containers only once the sidecar's startup probe (``/readyz``) passes,
  and stops the sidecar after them, so an app's last produces are still answered.
* The app containers are never touched: the app reaches the sidecar on
  ``localhost:<port>``, which every container of a pod shares.
* The sidecar's settings come from a ConfigMap (``sidecar.toml``), mounted read-only;
  the pod may name another ConfigMap with ``ordered-sidecar.io/config-map``. A volume of
  the same name that the pod already has is kept, not replaced.
* Idempotent: a pod that already has a container (init or regular) named
  ``ordered-sidecar`` gets no operations, so a re-invoked webhook, or a pod whose author
  wrote the sidecar in by hand, never gets a second one.
* A pod whose parts do not have the shapes of a Pod (``metadata`` or ``containers`` that
  are not an object or a list of objects, as no API server sends but a fuzzer or a bug
  may) is never patched: ``UnpatchablePod`` names the part, and the webhook allows the
  pod unchanged with that message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict

INJECT_ANNOTATION: Final = "ordered-sidecar.io/inject"
CONFIG_MAP_ANNOTATION: Final = "ordered-sidecar.io/config-map"
CONTAINER_NAME: Final = "ordered-sidecar"
CONFIG_VOLUME: Final = "ordered-sidecar-config"
CONFIG_DIR: Final = "/etc/ordered-sidecar"
CONFIG_FILE: Final = "sidecar.toml"
SIDECAR_UID: Final = 10001
"""The image's non-root USER (see the Dockerfile)."""

# A ConfigMap name is a DNS-1123 subdomain.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class InjectionError(ValueError):
    """The pod asks for something that cannot be injected (e.g. an invalid ConfigMap name)."""


class UnpatchablePod(ValueError):
    """The pod's parts do not have a Pod's shapes, so no patch could apply to it."""


class PatchOperation(TypedDict):
    """One RFC 6902 operation; injection only ever adds."""

    op: Literal["add"]
    path: str
    value: Any


@dataclass(frozen=True, slots=True)
class InjectConfig:
    """What every injected sidecar gets; the webhook's command-line flags."""

    image: str
    config_map: str = "ordered-sidecar-config"
    admin_token_secret: str | None = None
    """Secret holding the admin token (key ``admin_token_key``); None: no token env."""
    admin_token_key: str = "admin-token"
    port: int = 8082
    cpu_request: str = "100m"
    memory_request: str = "128Mi"
    memory_limit: str = "256Mi"
    image_pull_policy: str = "IfNotPresent"

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("the sidecar image must be set")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"the sidecar port must be between 1 and 65535, got {self.port}")
        if not _DNS_SUBDOMAIN.fullmatch(self.config_map):
            raise ValueError(f"invalid ConfigMap name {self.config_map!r}")


def opted_in(pod: Mapping[str, Any]) -> bool:
    """True when the pod carries ``ordered-sidecar.io/inject: "true"``.

    Raises UnpatchablePod when its metadata or annotations are not objects.
    """
    value = _annotations(pod).get(INJECT_ANNOTATION)
    return isinstance(value, str) and value.strip().lower() == "true"


def has_sidecar(pod: Mapping[str, Any]) -> bool:
    """True when any container of the pod (init or regular) is already the sidecar.

    Raises UnpatchablePod when its spec or container lists do not have a Pod's shapes.
    """
    spec = _spec(pod)
    containers = [*_objects(spec, "initContainers"), *_objects(spec, "containers")]
    return any(container.get("name") == CONTAINER_NAME for container in containers)


def patch_for(pod: Mapping[str, Any], config: InjectConfig) -> list[PatchOperation]:
    """The JSON Patch that injects the sidecar into ``pod``; empty if nothing to do.

    Raises InjectionError when the pod opts in with an invalid
    ``ordered-sidecar.io/config-map`` annotation, UnpatchablePod when a part the patch
    reads or extends does not have a Pod's shape.
    """
    if not opted_in(pod) or has_sidecar(pod):
        return []
    config_map = _annotations(pod).get(CONFIG_MAP_ANNOTATION, config.config_map)
    if not isinstance(config_map, str) or not _DNS_SUBDOMAIN.fullmatch(config_map):
        raise InjectionError(f"{CONFIG_MAP_ANNOTATION}: {config_map!r} is not a ConfigMap name")
    spec = _spec(pod)
    operations = _append(
        "/spec/initContainers", _objects(spec, "initContainers"), sidecar_container(config)
    )
    volumes = _objects(spec, "volumes")
    if not any(volume.get("name") == CONFIG_VOLUME for volume in volumes):
        operations += _append("/spec/volumes", volumes, config_volume(config_map))
    return operations


def sidecar_container(config: InjectConfig) -> dict[str, Any]:
    """The sidecar's init container (``restartPolicy: Always`` makes it a native sidecar)."""
    env: list[dict[str, Any]] = [
        # The app talks to the sidecar on localhost, but kubelet's HTTP probes and
        # Prometheus connect to the pod IP, which a 127.0.0.1 listener never answers.
        {"name": "ORDERED_SIDECAR__HTTP__HOST", "value": "0.0.0.0"},
        {"name": "ORDERED_SIDECAR__HTTP__PORT", "value": str(config.port)},
    ]
    if config.admin_token_secret is not None:
        env.append(
            {
                "name": "ORDERED_SIDECAR__HTTP__ADMIN_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": config.admin_token_secret,
                        "key": config.admin_token_key,
                    }
                },
            }
        )
    return {
        "name": CONTAINER_NAME,
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "restartPolicy": "Always",
        "args": ["serve", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"],
        "env": env,
        "ports": [{"name": "sidecar-http", "containerPort": config.port, "protocol": "TCP"}],
        # The app starts only when this passes: Kafka started, ZooKeeper connected.
        # 60 x 2 s gives a slow cluster two minutes before the sidecar is restarted.
        "startupProbe": _probe("/readyz", config.port, period=2, failures=60),
        "readinessProbe": _probe("/readyz", config.port, period=5, failures=2),
        "livenessProbe": _probe("/healthz", config.port, period=10, failures=3),
        "resources": {
            "requests": {"cpu": config.cpu_request, "memory": config.memory_request},
            "limits": {"memory": config.memory_limit},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SIDECAR_UID,
            "runAsGroup": SIDECAR_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}],
    }


def config_volume(config_map: str) -> dict[str, Any]:
    """The volume that carries ``sidecar.toml`` from ``config_map``."""
    return {"name": CONFIG_VOLUME, "configMap": {"name": config_map}}


def _probe(path: str, port: int, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def _append(
    path: str, existing: Sequence[Mapping[str, Any]], value: dict[str, Any]
) -> list[PatchOperation]:
    # "add" at ".../-" needs the array to exist; a missing (or null) one is created whole.
    if existing:
        return [{"op": "add", "path": f"{path}/-", "value": value}]
    return [{"op": "add", "path": path, "value": [value]}]


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return _object(_object(pod, "metadata", "metadata"), "annotations", "metadata.annotations")


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return _object(pod, "spec", "spec")


def _object(parent: Mapping[str, Any], field: str, where: str) -> Mapping[str, Any]:
    """``parent[field]`` when it is an object; {} when absent or null."""
    value = parent.get(field)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UnpatchablePod(f"{where} is not an object")
    return value


def _objects(spec: Mapping[str, Any], field: str) -> Sequence[Mapping[str, Any]]:
    """``spec[field]`` when it is a list of objects; [] when absent or null."""
    value = spec.get(field)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise UnpatchablePod(f"spec.{field} is not a list of objects")
    return value
