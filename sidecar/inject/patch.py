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
* Probes and Prometheus use the operations port (``ops_port``, on every address); the
  data plane (produce, consume, admin) stays on 127.0.0.1, the app's alone.
* Credentials: annotations name Secrets (``CREDENTIAL_ANNOTATIONS``). TLS files are
  mounted read-only under ``SECRETS_DIR`` and the security settings point at them;
  SASL and OAuth values reach the sidecar as environment variables taken from the
  Secret by ``secretKeyRef``, so they never appear in the pod's spec.
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
OPS_PORT_NAME: Final = "sidecar-ops"
"""The container port Prometheus' pod monitor and the NetworkPolicy name."""
SIDECAR_UID: Final = 10001
"""The image's non-root USER (see the Dockerfile)."""
SECRETS_DIR: Final = "/var/run/secrets/ordered-sidecar"
ENV: Final = "ORDERED_SIDECAR__"

# Credentials: each annotation names a Secret in the pod's namespace.
KAFKA_CA_SECRET: Final = "ordered-sidecar.io/kafka-ca-secret"
"""Key ``ca.crt``: the CA that signed the brokers' certificates (TLS)."""
KAFKA_CLIENT_CERT_SECRET: Final = "ordered-sidecar.io/kafka-client-cert-secret"
"""A ``kubernetes.io/tls`` Secret (``tls.crt``, ``tls.key``, optional ``key-password``):
the sidecar's client certificate (mutual TLS). A cert-manager Certificate writes one."""
KAFKA_SASL_SECRET: Final = "ordered-sidecar.io/kafka-sasl-secret"
"""Keys ``username`` and ``password`` (SASL PLAIN or SCRAM)."""
KAFKA_SASL_MECHANISM: Final = "ordered-sidecar.io/kafka-sasl-mechanism"
"""PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (the default)."""
KAFKA_OAUTH_SECRET: Final = "ordered-sidecar.io/kafka-oauth-secret"
"""Keys ``client-id`` and ``client-secret`` (OAUTHBEARER, client credentials grant)."""
KAFKA_OAUTH_TOKEN_ENDPOINT: Final = "ordered-sidecar.io/kafka-oauth-token-endpoint"
KAFKA_OAUTH_SCOPE: Final = "ordered-sidecar.io/kafka-oauth-scope"
ZOOKEEPER_CA_SECRET: Final = "ordered-sidecar.io/zookeeper-ca-secret"
"""Key ``ca.crt``: the CA of ZooKeeper's server certificate (TLS)."""
ZOOKEEPER_CLIENT_CERT_SECRET: Final = "ordered-sidecar.io/zookeeper-client-cert-secret"
"""A ``kubernetes.io/tls`` Secret: the sidecar's certificate for ZooKeeper (mutual TLS)."""
ZOOKEEPER_DIGEST_SECRET: Final = "ordered-sidecar.io/zookeeper-digest-secret"
"""Keys ``username`` and ``password`` (ZooKeeper digest authentication)."""
CREDENTIAL_ANNOTATIONS: Final = (
    KAFKA_CA_SECRET,
    KAFKA_CLIENT_CERT_SECRET,
    KAFKA_SASL_SECRET,
    KAFKA_OAUTH_SECRET,
    ZOOKEEPER_CA_SECRET,
    ZOOKEEPER_CLIENT_CERT_SECRET,
    ZOOKEEPER_DIGEST_SECRET,
)
CREDENTIAL_SETTINGS: Final = (
    *CREDENTIAL_ANNOTATIONS,
    KAFKA_SASL_MECHANISM,
    KAFKA_OAUTH_TOKEN_ENDPOINT,
    KAFKA_OAUTH_SCOPE,
)
"""Every annotation ``credentials_for`` reads."""
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

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
    """The data plane's port, on 127.0.0.1 (the app's ``localhost:<port>``)."""
    ops_port: int = 8081
    """The operations port (health, readiness, metrics), on every address of the pod."""
    cpu_request: str = "100m"
    memory_request: str = "128Mi"
    memory_limit: str = "256Mi"
    image_pull_policy: str = "IfNotPresent"
    default_credentials: tuple[tuple[str, str], ...] = ()
    """Credential annotations (``CREDENTIAL_ANNOTATIONS`` and their companions) applied
    to every injected pod that does not carry the annotation itself: the cluster's
    default Secrets, named once in the webhook's flags."""

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("the sidecar image must be set")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"the sidecar port must be between 1 and 65535, got {self.port}")
        if not 1 <= self.ops_port <= 65535 or self.ops_port == self.port:
            raise ValueError(
                f"the operations port must be between 1 and 65535 and differ from the "
                f"sidecar port, got {self.ops_port}"
            )
        if not _DNS_SUBDOMAIN.fullmatch(self.config_map):
            raise ValueError(f"invalid ConfigMap name {self.config_map!r}")
        for annotation, _ in self.default_credentials:
            if annotation not in CREDENTIAL_SETTINGS:
                raise ValueError(f"{annotation} is not a credential annotation")
        try:
            credentials_for(dict(self.default_credentials))
        except InjectionError as exc:
            raise ValueError(f"default credentials: {exc}") from exc


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
    credentials = credentials_for({**dict(config.default_credentials), **_annotations(pod)})
    spec = _spec(pod)
    container = sidecar_container(config)
    container["env"] += credentials.env
    container["volumeMounts"] += credentials.mounts
    operations = _append("/spec/initContainers", _objects(spec, "initContainers"), container)
    volumes = list(_objects(spec, "volumes"))
    added = (
        [] if any(v.get("name") == CONFIG_VOLUME for v in volumes) else [config_volume(config_map)]
    )
    for volume in [*added, *credentials.volumes]:
        operations += _append("/spec/volumes", volumes, volume)
        volumes.append(volume)
    return operations


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the credential annotations add to the sidecar container and the pod."""

    env: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    volumes: list[dict[str, Any]]


def credentials_for(annotations: Mapping[str, Any]) -> Credentials:
    """The environment, mounts and volumes the pod's credential annotations ask for.

    The names are the sidecar's security settings (``kafka.security.*``,
    ``zookeeper.security.*``) in their environment form. Raises InjectionError naming
    the annotation whose value cannot be used.
    """
    named = {key: _secret_name(annotations, key) for key in CREDENTIAL_ANNOTATIONS}
    env: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []

    def mount(annotation: str, directory: str, keys: tuple[str, ...]) -> str:
        """Mount the named Secret's ``keys`` read-only; returns the directory."""
        volume = f"ordered-sidecar-{directory}"
        path = f"{SECRETS_DIR}/{directory}"
        volumes.append(
            {
                "name": volume,
                "secret": {
                    "secretName": named[annotation],
                    "items": [{"key": key, "path": key} for key in keys],
                    # Read by the sidecar's non-root user, written by nobody.
                    "defaultMode": 0o444,
                },
            }
        )
        mounts.append({"name": volume, "mountPath": path, "readOnly": True})
        return path

    def setting(name: str, value: str) -> None:
        env.append({"name": f"{ENV}{name}", "value": value})

    def from_secret(name: str, annotation: str, key: str, *, optional: bool = False) -> None:
        reference: dict[str, Any] = {"name": named[annotation], "key": key}
        if optional:
            reference["optional"] = True
        env.append({"name": f"{ENV}{name}", "valueFrom": {"secretKeyRef": reference}})

    # Kafka --------------------------------------------------------------------------
    tls = named[KAFKA_CA_SECRET] is not None or named[KAFKA_CLIENT_CERT_SECRET] is not None
    sasl = named[KAFKA_SASL_SECRET] is not None
    oauth = named[KAFKA_OAUTH_SECRET] is not None
    if sasl and oauth:
        raise InjectionError(
            f"{KAFKA_SASL_SECRET} and {KAFKA_OAUTH_SECRET} exclude each other: one SASL "
            "mechanism per client"
        )
    if tls or sasl or oauth:
        protocol = ("SASL_SSL" if tls else "SASL_PLAINTEXT") if sasl or oauth else "SSL"
        setting("KAFKA__SECURITY__PROTOCOL", protocol)
    if named[KAFKA_CA_SECRET] is not None:
        path = mount(KAFKA_CA_SECRET, "kafka-ca", ("ca.crt",))
        setting("KAFKA__SECURITY__SSL_CAFILE", f"{path}/ca.crt")
    if named[KAFKA_CLIENT_CERT_SECRET] is not None:
        path = mount(KAFKA_CLIENT_CERT_SECRET, "kafka-client-cert", ("tls.crt", "tls.key"))
        setting("KAFKA__SECURITY__SSL_CERTFILE", f"{path}/tls.crt")
        setting("KAFKA__SECURITY__SSL_KEYFILE", f"{path}/tls.key")
        # An encrypted key's password, when the Secret has one.
        from_secret(
            "KAFKA__SECURITY__SSL_KEY_PASSWORD",
            KAFKA_CLIENT_CERT_SECRET,
            "key-password",
            optional=True,
        )
    if sasl:
        mechanism = annotations.get(KAFKA_SASL_MECHANISM, "SCRAM-SHA-512")
        if mechanism not in SASL_MECHANISMS:
            raise InjectionError(
                f"{KAFKA_SASL_MECHANISM}: {mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}"
            )
        setting("KAFKA__SECURITY__SASL_MECHANISM", mechanism)
        from_secret("KAFKA__SECURITY__SASL_USERNAME", KAFKA_SASL_SECRET, "username")
        from_secret("KAFKA__SECURITY__SASL_PASSWORD", KAFKA_SASL_SECRET, "password")
    elif KAFKA_SASL_MECHANISM in annotations:
        raise InjectionError(f"{KAFKA_SASL_MECHANISM} needs {KAFKA_SASL_SECRET}")
    if oauth:
        endpoint = annotations.get(KAFKA_OAUTH_TOKEN_ENDPOINT)
        if not isinstance(endpoint, str) or not endpoint.startswith("https://"):
            raise InjectionError(
                f"{KAFKA_OAUTH_SECRET} needs {KAFKA_OAUTH_TOKEN_ENDPOINT}, an https:// URL"
            )
        setting("KAFKA__SECURITY__SASL_MECHANISM", "OAUTHBEARER")
        setting("KAFKA__SECURITY__OAUTH_TOKEN_ENDPOINT", endpoint)
        from_secret("KAFKA__SECURITY__OAUTH_CLIENT_ID", KAFKA_OAUTH_SECRET, "client-id")
        from_secret("KAFKA__SECURITY__OAUTH_CLIENT_SECRET", KAFKA_OAUTH_SECRET, "client-secret")
        scope = annotations.get(KAFKA_OAUTH_SCOPE)
        if isinstance(scope, str) and scope:
            setting("KAFKA__SECURITY__OAUTH_SCOPE", scope)
    else:
        for annotation in (KAFKA_OAUTH_TOKEN_ENDPOINT, KAFKA_OAUTH_SCOPE):
            if annotation in annotations:
                raise InjectionError(f"{annotation} needs {KAFKA_OAUTH_SECRET}")

    # ZooKeeper ----------------------------------------------------------------------
    if named[ZOOKEEPER_CA_SECRET] is not None or named[ZOOKEEPER_CLIENT_CERT_SECRET] is not None:
        setting("ZOOKEEPER__SECURITY__TLS", "true")
    if named[ZOOKEEPER_CA_SECRET] is not None:
        path = mount(ZOOKEEPER_CA_SECRET, "zookeeper-ca", ("ca.crt",))
        setting("ZOOKEEPER__SECURITY__SSL_CAFILE", f"{path}/ca.crt")
    if named[ZOOKEEPER_CLIENT_CERT_SECRET] is not None:
        path = mount(ZOOKEEPER_CLIENT_CERT_SECRET, "zookeeper-client-cert", ("tls.crt", "tls.key"))
        setting("ZOOKEEPER__SECURITY__SSL_CERTFILE", f"{path}/tls.crt")
        setting("ZOOKEEPER__SECURITY__SSL_KEYFILE", f"{path}/tls.key")
    if named[ZOOKEEPER_DIGEST_SECRET] is not None:
        from_secret("ZOOKEEPER__SECURITY__DIGEST_USERNAME", ZOOKEEPER_DIGEST_SECRET, "username")
        from_secret("ZOOKEEPER__SECURITY__DIGEST_PASSWORD", ZOOKEEPER_DIGEST_SECRET, "password")
    return Credentials(env, mounts, volumes)


def _secret_name(annotations: Mapping[str, Any], annotation: str) -> str | None:
    value = annotations.get(annotation)
    if value is None:
        return None
    if not isinstance(value, str) or not _DNS_SUBDOMAIN.fullmatch(value):
        raise InjectionError(f"{annotation}: {value!r} is not a Secret name")
    return value


def sidecar_container(config: InjectConfig) -> dict[str, Any]:
    """The sidecar's init container (``restartPolicy: Always`` makes it a native sidecar)."""
    env: list[dict[str, Any]] = [
        # The app talks to the data plane on localhost (its default, 127.0.0.1); kubelet's
        # HTTP probes and Prometheus connect to the pod IP: the operations listener.
        {"name": "ORDERED_SIDECAR__HTTP__PORT", "value": str(config.port)},
        {"name": "ORDERED_SIDECAR__HTTP__OPS_HOST", "value": "0.0.0.0"},
        {"name": "ORDERED_SIDECAR__HTTP__OPS_PORT", "value": str(config.ops_port)},
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
        # Only the operations port is declared: the data plane answers on loopback alone.
        "ports": [{"name": OPS_PORT_NAME, "containerPort": config.ops_port, "protocol": "TCP"}],
        # The app starts only when this passes: Kafka, ZooKeeper and the producers ready.
        # The sidecar waits for them itself (it never exits for an outage), so a long
        # startup window costs nothing: 150 x 2 s, five minutes, before a restart.
        "startupProbe": _probe("/readyz", config.ops_port, period=2, failures=150),
        "readinessProbe": _probe("/readyz", config.ops_port, period=5, failures=2),
        "livenessProbe": _probe("/healthz", config.ops_port, period=10, failures=3),
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
