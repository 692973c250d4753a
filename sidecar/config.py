"""The sidecar's one configuration object.

Loaded once at start from an optional TOML file, then environment variables
``ORDERED_SIDECAR__<SECTION>__<KEY>`` (environment wins), validated, and frozen.
Secrets (the admin token, Kafka and ZooKeeper passwords) are ``Secret`` values: their
``repr`` and ``str`` are redacted, and only ``reveal()`` gives the text. A secret may
instead be read from a file (``*_file`` settings), re-read each time a client is built.

Example file::

    [kafka]
    bootstrap_servers = "127.0.0.1:9092"
    [kafka.security]          # every Kafka client the sidecar makes
    protocol = "SASL_SSL"
    sasl_mechanism = "SCRAM-SHA-512"
    sasl_username = "orders-sidecar"
    sasl_password_file = "/var/run/secrets/kafka/password"
    [kafka.client]            # other aiokafka settings, passed through
    linger_ms = 5
    [zookeeper]
    hosts = "127.0.0.1:2181"
    root = "/ordered"
    [http]
    port = 8082
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sidecar.core import names
from sidecar.core.errors import InvalidName
from sidecar.core.placement import HeaderFormat

ENV_PREFIX = "ORDERED_SIDECAR__"
MAX_TRANSACTION_LANES = 8
_SECRET_WORDS = ("password", "secret", "token", "key")


class ConfigError(ValueError):
    """The configuration is invalid: a value of the wrong type or out of range."""


class Secret:
    """A password, client secret or token: never shown by ``repr`` or ``str``."""

    __slots__ = ("_value",)

    def __init__(self, value: str = "") -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__


KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
ZOOKEEPER_SASL_MECHANISMS = ("", "DIGEST-MD5")


@dataclass(frozen=True, slots=True)
class KafkaSecuritySettings:
    """How every Kafka client of the sidecar authenticates and encrypts (``kafka.security``)."""

    protocol: str = "PLAINTEXT"
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
    ssl_cafile: str = ""
    """PEM file of the CAs the brokers' certificates chain to; empty: the system's CAs."""
    ssl_certfile: str = ""
    """The client certificate (PEM, chain allowed) for mutual TLS."""
    ssl_keyfile: str = ""
    """The client certificate's private key (PEM), possibly encrypted."""
    ssl_key_password: Secret = field(default_factory=Secret)
    ssl_key_password_file: str = ""
    ssl_check_hostname: bool = True
    """The broker's certificate must name the host the client connects to."""
    sasl_mechanism: str = ""
    """PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (with a SASL_ protocol)."""
    sasl_username: str = ""
    sasl_password: Secret = field(default_factory=Secret)
    sasl_password_file: str = ""
    oauth_token_endpoint: str = ""
    """OAUTHBEARER: the OIDC token endpoint of the client-credentials flow."""
    oauth_client_id: str = ""
    oauth_client_secret: Secret = field(default_factory=Secret)
    oauth_client_secret_file: str = ""
    oauth_scope: str = ""
    oauth_token_file: str = ""
    """OAUTHBEARER: a file holding the token, kept fresh by a platform agent (instead of
    the token endpoint); read again at every new connection."""

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def key_password(self) -> str | None:
        """The private key's password (read from its file if one is named), or None."""
        return _secret(self.ssl_key_password, self.ssl_key_password_file) or None

    def password(self) -> str:
        """The SASL PLAIN/SCRAM password (read from its file if one is named)."""
        return _secret(self.sasl_password, self.sasl_password_file)

    def client_secret(self) -> str:
        """The OIDC client secret (read from its file if one is named)."""
        return _secret(self.oauth_client_secret, self.oauth_client_secret_file)


@dataclass(frozen=True, slots=True)
class ZooKeeperSecuritySettings:
    """How the sidecar connects to ZooKeeper and protects its znodes (``zookeeper.security``)."""

    tls: bool = False
    """Connect to ZooKeeper's secure client port (``secureClientPort``) over TLS."""
    ssl_cafile: str = ""
    """PEM file of the CAs ZooKeeper's certificate chains to; empty: the system's CAs."""
    ssl_certfile: str = ""
    """A client certificate (PEM), where ZooKeeper asks for one."""
    ssl_keyfile: str = ""
    ssl_check_hostname: bool = True
    """ZooKeeper's certificate must name the host connected to."""
    sasl_mechanism: str = ""
    """``DIGEST-MD5``: authenticate by SASL as ``digest_username``; empty with a
    ``digest_username``: ZooKeeper's digest scheme (``addauth digest``)."""
    digest_username: str = ""
    digest_password: Secret = field(default_factory=Secret)
    digest_password_file: str = ""
    world_readable: bool = True
    """With an identity set, every znode the sidecars create gets ALL for that identity
    and, if true, READ for anyone (dashboards, ``zkCli``); false: no access for others."""

    @property
    def authenticated(self) -> bool:
        return bool(self.digest_username)

    def password(self) -> str:
        """The SASL or digest password (read from its file if one is named)."""
        return _secret(self.digest_password, self.digest_password_file)


def _secret(value: Secret, path: str) -> str:
    if not path:
        return value.reveal()
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "ordered-sidecar"
    request_timeout_ms: int = 10_000
    """How long any Kafka request may take, a produce's replication included."""
    replication_margin_ms: int = 2_000
    """How long an appended record may take to reach the high watermark after its request
    timed out (follower fetch waits, a leader change). With ``request_timeout_ms`` it is
    what ``zookeeper.session_timeout_s`` must exceed (see ``Settings.validate``)."""
    transaction_timeout_ms: int = 20_000
    """Kafka aborts a transaction of this sidecar left open longer (a paused process)."""
    reset_backoff_s: float = 0.5
    """Pause between tries of re-initialising the transactional producer."""
    retry_backoff_s: float = 0.1
    """Pause between tries of a retriable metadata or admin request, and between looks
    at the metadata while waiting for a topic or its new partitions to show."""
    transaction_poll_ms: float = 20.0
    """How often the transactional producer asks again to add a partition to a new
    transaction while Kafka is still writing the previous one's markers. 20 ms is
    aiokafka's and Java's value; the markers take a few ms, so most of a lone
    transaction's time is that wait (5 ms more than halved it in ``bench.produce``).
    Lower costs the transaction coordinator more requests; the default stays at 20 ms
    until the lower value has been through the fault tests (docs/fencing.md)."""
    transaction_lanes: int = 3
    """Transactional ids (each with its own producer) a sidecar writes through in turn:
    with more than one, the next transaction is appended while the previous one commits
    and Kafka writes its markers, instead of waiting for them. Transactions still commit
    one after the other, in order. Each lane is one more producer (connections, memory)
    and one more id to fence at a change."""
    security: KafkaSecuritySettings = field(default_factory=KafkaSecuritySettings)
    """TLS, mutual TLS and SASL of every Kafka client (``kafka.security``)."""
    client: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    """Other aiokafka client settings (``linger_ms``, ...), passed through; a value from
    the environment is converted to the type aiokafka expects."""

    def __repr__(self) -> str:
        return (
            f"KafkaSettings(bootstrap_servers={self.bootstrap_servers!r}, "
            f"client_id={self.client_id!r}, request_timeout_ms={self.request_timeout_ms}, "
            f"security={self.security!r}, client={_redacted(self.client)!r})"
        )


@dataclass(frozen=True, slots=True)
class ZooKeeperSettings:
    hosts: str = "127.0.0.1:2181"
    root: str = "/ordered"
    session_timeout_s: float = 15.0
    """A sidecar cut off (or paused) this long is no longer waited for by barriers."""
    lock_poll_s: float = 0.05
    """How often a topic's change lock is tried again while another sidecar holds it."""
    transaction_attempts: int = 5
    """Tries of a multi-node ZooKeeper transaction that lost a compare-and-set race."""
    topic_list_interval_s: float = 1.0
    """How often the list of managed topics is re-read, so that a topic managed by
    another sidecar is watched (and its barriers acked) within this delay."""
    security: ZooKeeperSecuritySettings = field(default_factory=ZooKeeperSecuritySettings)
    """TLS, authentication and the ACLs of the znodes (``zookeeper.security``)."""


ACCESS_LOG_MODES = ("off", "errors", "all")
HEADER_FORMATS = tuple(header_format.value for header_format in HeaderFormat)


@dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str = "127.0.0.1"
    port: int = 8082
    max_body_bytes: int = 8 * 1024 * 1024
    admin_enabled: bool = False
    admin_token: str = field(default="", repr=False)
    max_connections: int = 1000
    """Connections open at once; one more is answered 503 and closed unread."""
    header_read_timeout_s: float = 10.0
    """A request head must be complete this long after the connection opened (or after
    its first byte on a kept-alive connection), or the connection is closed."""
    body_read_timeout_s: float = 30.0
    """A request body must be complete this long after its head, or 408 and closed."""
    keepalive_timeout_s: float = 75.0
    """An idle kept-alive connection is closed after this long (nginx's default: longer
    than the idle time most HTTP clients reuse a connection for)."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM, how long requests in progress may take before the server closes."""
    lingering_time_s: float = 2.0
    """aiohttp's ``lingering_time``: after an answer that closes a connection whose body
    was not read (a 408, a 413), how long the rest of the body is read and dropped so the
    client can read the answer. aiohttp's default, 10 s, would keep a connection whose
    body never comes open that much longer."""
    refusal_linger_s: float = 1.0
    """How long a connection refused over ``max_connections`` is kept half-closed so the
    client reads its 503 (closing with its request unread would reset the connection and
    lose the answer)."""
    access_log: str = "errors"
    """``errors``: one line per request answered 400 or above; ``all``: every request;
    ``off``: none (logger ``sidecar.access``, INFO)."""
    ops_host: str = "127.0.0.1"
    """The operations listener's address (``/healthz``, ``/readyz``, ``/metrics`` and
    nothing else). In Kubernetes ``0.0.0.0``, so kubelet and Prometheus reach it at the
    pod IP; the data plane stays on ``host``."""
    ops_port: int = 8081
    data_token: str = field(default="", repr=False)
    """When set, every data-plane request (produce, consume, v3, admin) needs
    ``X-Sidecar-Token: <token>``. Required when ``host`` is not a loopback address:
    the data plane is the app's alone."""


@dataclass(frozen=True, slots=True)
class ProduceSettings:
    hold_timeout_s: float = 30.0
    """How long a produce may wait for a barrier or a ZooKeeper reconnect before 503."""
    barrier_timeout_s: float = 20.0
    """How long a coordinator waits for every live sidecar to ack before rolling back."""
    tombstone_cache_size: int = 100_000
    unmanaged_cache_size: int = 10_000
    """Most "this topic is not managed" answers kept (topic names come from clients, so
    the cache is bounded; the oldest answer is forgotten first)."""
    unmanaged_cache_s: float = 1.0
    """How long "this topic is not managed" is believed without asking ZooKeeper again
    (a new managed topic is also noticed at once by a watch). Shorter than the session
    timeout, so a sidecar resumed after a pause past its session asks again."""
    writer_retry_s: float = 0.5
    """Pause between tries of replacing a fenced or lost transactional producer."""
    stream_max_in_flight: int = 100
    """Records of one REST v3 streaming request being written at once; the next record
    is read from the request when the oldest has been answered."""
    stream_idle_timeout_s: float = 300.0
    """A REST v3 stream that sends no byte this long is ended (with a 408 entry)."""
    header_format: str = "stamp"
    """How a managed record's routing is written: ``stamp``, one ``ordered.stamp``
    header, or ``separate``, the four headers sidecars before the stamp read. Every
    sidecar reads both; set ``separate`` while a rolling upgrade still runs old ones."""


@dataclass(frozen=True, slots=True)
class ChangeSettings:
    """Partition-count changes, retirement and the housekeeping that resumes them."""

    barrier_poll_s: float = 0.02
    """How often a coordinator re-reads barrier acks (a watch would save little here:
    the barrier lasts as long as the slowest sidecar's in-flight sends)."""
    action_retry_s: float = 0.5
    """Pause before a coordinator retries a step that failed (Kafka or ZooKeeper away)."""
    lock_timeout_s: float = 10.0
    """How long a change waits for the topic's lock. Housekeeping (retirement,
    resumption) holds it briefly; a change in progress is refused at once from its
    journal, not by timing out on the lock."""
    retirement_lock_timeout_s: float = 0.5
    """How long retirement waits for the topic's lock (it tries again next round)."""
    housekeeping_interval_s: float = 2.0
    """How often a sidecar looks for changes whose coordinator died and for partitions
    to retire (every sidecar does; the topic lock makes one of them act)."""
    warm_within_s: float = 2.0
    """How long an expansion may spend, before its barrier holds any produce, giving
    each partition it adds a first replicated write (aborted: nobody reads it), which
    otherwise the first produces after the commit wait for. 0 skips it."""


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """The consume path's tunables (REST consumer instances)."""

    gate_recheck_s: float = 0.05
    """How often a waiting poll re-reads the group's committed offsets."""
    buffer_limit: int = 2000
    """Records buffered per partition before fetching from it pauses."""
    auto_commit_interval_s: float = 5.0
    """How often an auto-committing instance commits what it delivered."""
    metadata_max_age_ms: int = 3000
    """How soon an instance's Kafka consumer notices added partitions (and rebalances)."""
    rebalance_window_s: float = 0.5
    """Changes of a topic's assignable partitions this close together make one
    rebalance of the groups reading it (each rebalance pauses the whole group)."""
    revoke_ack_wait_s: float = 10.0
    """How long a rebalance waits for the app to acknowledge keys_revoked events."""
    fetch_grace_s: float = 0.05
    """How much longer than its own timeout a poll waits for the Kafka fetch."""
    callback_retry_s: float = 0.2
    """Pause between attempts of a hand-off callback."""
    instance_idle_timeout_s: float = 300.0
    """A consumer instance unused this long is closed (REST Proxy's instance timeout)."""
    max_poll_bytes: int = 64 * 1024 * 1024
    """The largest ``max_bytes`` a records request may ask for."""
    callback_patience_s: float = 30.0
    """How long a hand-off callback that a release or a commit waits for is retried, at
    least (longer if ``callback_timeout_s`` of the instance is)."""
    revoke_ack_poll_s: float = 0.02
    """How often a rebalance that waits for keys_revoked acknowledgements looks again."""
    idle_check_interval_s: float = 10.0
    """The longest pause between two looks for idle instances (half of
    ``instance_idle_timeout_s`` if that is shorter)."""
    stall_fence_s: float = 5.0
    """After this sidecar's event loop did not run for this long (a stopped process, a
    paused VM), its consumer instances tell no key hand-off and release nothing until
    their group has rebalanced (they ask it to): meanwhile the group may have given
    their partitions to another instance, whose app is told. Below Kafka's consumer
    session timeout (10 s by default); 0: off."""


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Bounds on the Prometheus exposition: topic and group names are the apps' choice,
    and each one would be a series of every labelled metric."""

    max_topic_labels: int = 1000
    """Topics counted under their own name; the others under ``_other``."""
    max_group_labels: int = 100
    """Consumer groups counted under their own name; the others under ``_other``."""


@dataclass(frozen=True, slots=True)
class AuditSettings:
    enabled: bool = False
    topic: str = "ordered-sidecar-audit"
    sample_rate: float = 1.0
    """Fraction of keys whose record events are emitted (chosen by key hash, so a sampled
    key's history is complete); key-less events are always emitted."""
    buffer_size: int = 100_000
    """Events waiting to be sent; beyond it events are dropped and counted, never waited for."""
    batch_size: int = 500
    """Events sent to the audit topic in one batch."""
    partitions: int = 6
    """Partitions of the audit topic when the sidecar creates it."""


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    """The Python process the sidecar runs in."""

    gc_young_threshold: int = 50_000
    """Allocations (net of frees) between two collections of Python's youngest garbage
    generation; Python's default is 700. A consume response builds a few objects per
    record (the record, its header tuples), tens of thousands at a time, and at 700 the
    collector runs, and walks the objects still alive, every few dozen records. Reading
    a managed topic of 100-byte records, 50,000 against 700 on one sidecar each, same
    cluster, alternating: 1.2-1.4x the records/s, and the same RSS (95 MiB after the
    reads, either way). Memory freed by reference counting, nearly all of it, is freed at
    once either way; only reference cycles wait for the collector."""


@dataclass(frozen=True, slots=True)
class StartupSettings:
    """How a sidecar waits for Kafka, ZooKeeper and its producers at start."""

    retry_initial_s: float = 0.2
    """The pause after the first failed try; it doubles at each failure after that."""
    retry_max_s: float = 2.0
    """The longest pause between tries (half of it random, so sidecars restarted
    together spread out). A sidecar is ready at most this long after its cluster is."""


LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True, slots=True)
class LogSettings:
    format: str = "text"
    """``text``: one readable line per event; ``json``: one JSON object per line (time,
    level, logger, message, and the exception when there is one), for log collectors."""
    level: str = "INFO"


@dataclass(frozen=True, slots=True)
class FaultSettings:
    """Fault injection for the crash tests; empty in production."""

    kill_after_phase: str = ""
    """SIGKILL this process right after it journals a change entering this phase."""
    withhold_barrier_acks: bool = False
    """Never ack a barrier, as a sidecar whose sends never settle: changes time out."""
    stop_before_commit: int = 0
    """SIGSTOP this process before committing its Nth transaction, once its records were
    appended (0: never): a zombie with an open transaction, for the fencing tests."""


@dataclass(frozen=True, slots=True)
class Settings:
    sidecar_id: str
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    zookeeper: ZooKeeperSettings = field(default_factory=ZooKeeperSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    produce: ProduceSettings = field(default_factory=ProduceSettings)
    changes: ChangeSettings = field(default_factory=ChangeSettings)
    consumer: ConsumerSettings = field(default_factory=ConsumerSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    process: ProcessSettings = field(default_factory=ProcessSettings)
    faults: FaultSettings = field(default_factory=FaultSettings)
    startup: StartupSettings = field(default_factory=StartupSettings)
    log: LogSettings = field(default_factory=LogSettings)

    def validate(self) -> Settings:
        """Refuse combinations that break the timing the design rests on; returns self.

        Raises ConfigError naming the settings involved.
        """
        try:
            # Both are part of ZooKeeper node names (registration, barrier acks, the
            # producer registry) and of Kafka transactional ids: refused at start, not
            # at registration.
            names.sidecar_id(self.sidecar_id, "sidecar_id")
            names.node_name(self.kafka.client_id, "kafka.client_id")
        except InvalidName as exc:
            raise ConfigError(
                f"{exc.message} (it is part of ZooKeeper node names and Kafka transactional ids)"
            ) from exc
        session_ms = self.zookeeper.session_timeout_s * 1000
        send_ms = self.kafka.request_timeout_ms + self.kafka.replication_margin_ms
        if session_ms <= send_ms:
            raise ConfigError(
                f"zookeeper.session_timeout_s ({self.zookeeper.session_timeout_s:g} s) must exceed "
                f"kafka.request_timeout_ms + kafka.replication_margin_ms ({send_ms / 1000:g} s): "
                "a sidecar whose session expired must have no send left that could still land"
            )
        if self.produce.barrier_timeout_s <= self.zookeeper.session_timeout_s:
            raise ConfigError(
                f"produce.barrier_timeout_s ({self.produce.barrier_timeout_s:g} s) must exceed "
                f"zookeeper.session_timeout_s ({self.zookeeper.session_timeout_s:g} s): otherwise "
                "a crashed sidecar rolls every change back instead of being left behind"
            )
        if not 0 <= self.produce.unmanaged_cache_s < self.zookeeper.session_timeout_s:
            raise ConfigError(
                f"produce.unmanaged_cache_s ({self.produce.unmanaged_cache_s:g} s) must be at "
                f"least 0 and less than zookeeper.session_timeout_s "
                f"({self.zookeeper.session_timeout_s:g} s): a sidecar resumed after a pause past "
                "its session must ask again whether a topic became managed meanwhile"
            )
        if self.kafka.transaction_timeout_ms <= self.kafka.request_timeout_ms:
            raise ConfigError(
                f"kafka.transaction_timeout_ms ({self.kafka.transaction_timeout_ms}) must exceed "
                f"kafka.request_timeout_ms ({self.kafka.request_timeout_ms}): a transaction "
                "commits within one request timeout"
            )
        if not 1 <= self.kafka.transaction_lanes <= MAX_TRANSACTION_LANES:
            raise ConfigError(
                f"kafka.transaction_lanes ({self.kafka.transaction_lanes}) must be from 1 to "
                f"{MAX_TRANSACTION_LANES}: each lane is a producer of its own"
            )
        if self.changes.housekeeping_interval_s >= self.produce.barrier_timeout_s:
            raise ConfigError(
                f"changes.housekeeping_interval_s ({self.changes.housekeeping_interval_s:g} s) "
                f"must be below produce.barrier_timeout_s ({self.produce.barrier_timeout_s:g} s): "
                "a change whose coordinator died is resumed before its barrier times out"
            )
        if self.zookeeper.lock_poll_s >= self.changes.lock_timeout_s:
            raise ConfigError(
                f"zookeeper.lock_poll_s ({self.zookeeper.lock_poll_s:g} s) must be below "
                f"changes.lock_timeout_s ({self.changes.lock_timeout_s:g} s): the lock is "
                "tried at least twice"
            )
        if self.consumer.gate_recheck_s >= self.consumer.instance_idle_timeout_s:
            raise ConfigError(
                f"consumer.gate_recheck_s ({self.consumer.gate_recheck_s:g} s) must be below "
                f"consumer.instance_idle_timeout_s ({self.consumer.instance_idle_timeout_s:g} s)"
            )
        return self


_SECTIONS: dict[str, type[Any]] = {
    "kafka": KafkaSettings,
    "zookeeper": ZooKeeperSettings,
    "http": HttpSettings,
    "produce": ProduceSettings,
    "changes": ChangeSettings,
    "consumer": ConsumerSettings,
    "audit": AuditSettings,
    "metrics": MetricsSettings,
    "process": ProcessSettings,
    "faults": FaultSettings,
    "startup": StartupSettings,
    "log": LogSettings,
}


def default_sidecar_id() -> str:
    """Host name plus a short random suffix: unique per process, readable in ZooKeeper."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from ``path`` (TOML, optional) and the environment.

    Raises ConfigError for an unknown section or key, or a value of the wrong type.
    """
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as handle:
                raw = tomllib.load(handle)
        except OSError as exc:
            raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from exc
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        target = raw
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    settings = Settings(sidecar_id=str(raw.pop("sidecar_id", "") or default_sidecar_id()))
    for section, values in raw.items():
        if section not in _SECTIONS:
            raise ConfigError(f"unknown configuration section {section!r}")
        if not isinstance(values, dict):
            raise ConfigError(f"section {section!r} must be a table")
        built = _build_section(_SECTIONS[section], section, values)
        _validate(section, built)
        settings = replace(settings, **{section: built})
    return settings.validate()


def _build_section(cls: type[Any], section: str, values: dict[str, Any]) -> Any:
    known = {f.name: f for f in fields(cls)}
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown setting {section}.{key}")
        if key == "client":
            if not isinstance(value, dict):
                raise ConfigError(f"{section}.client must be a table of client settings")
            kwargs[key] = dict(value)
            continue
        if key == "security":
            if not isinstance(value, dict):
                raise ConfigError(f"{section}.security must be a table")
            kwargs[key] = _build_section(type(getattr(defaults, key)), f"{section}.security", value)
            continue
        expected = type(getattr(defaults, key))
        if expected is Secret:
            if not isinstance(value, str):
                raise ConfigError(f"{section}.{key} must be a str")
            kwargs[key] = Secret(value.strip())
            continue
        kwargs[key] = _coerce(f"{section}.{key}", value, expected)
    return cls(**kwargs)


def _coerce(name: str, value: Any, expected: type[Any]) -> Any:
    # Environment values arrive as strings; TOML values already have their types.
    try:
        if expected is bool and isinstance(value, str):
            lowered = value.strip().lower()
            if lowered not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError(value)
            return lowered in {"true", "1", "yes"}
        if isinstance(value, str):
            return expected(value.strip())
        # TOML values already carry a type: accept only the expected one (an int where a
        # float is expected), never a silent conversion such as 1.5 -> 1 or true -> 1.
        if isinstance(value, bool) != (expected is bool):
            raise ValueError(value)
        if isinstance(value, expected) or (expected is float and isinstance(value, int)):
            return expected(value)
        raise ValueError(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must be a {expected.__name__}, got {value!r}") from exc


def _redacted(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: "***" if any(word in key.lower() for word in _SECRET_WORDS) else value
        for key, value in values.items()
    }


def _validate_http_limits(values: HttpSettings) -> None:
    if values.access_log not in ACCESS_LOG_MODES:
        raise ConfigError(
            f"http.access_log must be one of off, errors, all; got {values.access_log!r}"
        )
    if values.max_connections < 1:
        raise ConfigError(f"http.max_connections must be at least 1, got {values.max_connections}")
    for name in ("header_read_timeout_s", "body_read_timeout_s", "keepalive_timeout_s"):
        if not getattr(values, name) > 0:
            raise ConfigError(f"http.{name} must be positive, got {getattr(values, name)}")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _validate_listeners(values: HttpSettings) -> None:
    if not 0 <= values.ops_port <= 65535:
        raise ConfigError(f"http.ops_port must be between 0 and 65535, got {values.ops_port}")
    if values.ops_port != 0 and values.ops_port == values.port:
        raise ConfigError(
            f"http.ops_port ({values.ops_port}) must differ from http.port: the operations "
            "listener is a port of its own"
        )
    if not _is_loopback(values.host) and not values.data_token:
        raise ConfigError(
            f"http.host is {values.host!r}, not a loopback address: set http.data_token too "
            "(the data plane is the app's alone; probes and scrapes use http.ops_host)"
        )


def _validate_startup(values: StartupSettings) -> None:
    if not 0 < values.retry_initial_s <= values.retry_max_s:
        raise ConfigError(
            f"startup.retry_initial_s ({values.retry_initial_s:g}) must be positive and at "
            f"most startup.retry_max_s ({values.retry_max_s:g})"
        )


def _validate_log(values: LogSettings) -> None:
    if values.format not in LOG_FORMATS:
        raise ConfigError(f"log.format must be one of text, json; got {values.format!r}")
    if values.level.upper() not in LOG_LEVELS:
        raise ConfigError(f"log.level must be one of {', '.join(LOG_LEVELS)}; got {values.level!r}")


_POSITIVE = {
    "changes": (
        "barrier_poll_s",
        "action_retry_s",
        "lock_timeout_s",
        "retirement_lock_timeout_s",
        "housekeeping_interval_s",
    ),
    "zookeeper": ("lock_poll_s", "transaction_attempts", "topic_list_interval_s"),
    "kafka": ("reset_backoff_s", "retry_backoff_s", "transaction_poll_ms"),
    "http": ("shutdown_grace_s", "lingering_time_s", "refusal_linger_s"),
    "produce": (
        "writer_retry_s",
        "stream_max_in_flight",
        "stream_idle_timeout_s",
        "unmanaged_cache_size",
    ),
    "audit": ("batch_size", "partitions"),
    "metrics": ("max_topic_labels", "max_group_labels"),
}


def _validate_positive(section: str, values: Any) -> None:
    for name in _POSITIVE[section]:
        if not getattr(values, name) > 0:
            raise ConfigError(f"{section}.{name} must be positive, got {getattr(values, name)}")


def _validate_consumer(values: ConsumerSettings) -> None:
    if values.buffer_limit < 1:
        raise ConfigError(f"consumer.buffer_limit must be at least 1, got {values.buffer_limit}")
    for name in (
        "gate_recheck_s",
        "auto_commit_interval_s",
        "metadata_max_age_ms",
        "revoke_ack_wait_s",
        "rebalance_window_s",
        "callback_retry_s",
        "instance_idle_timeout_s",
        "callback_patience_s",
        "max_poll_bytes",
        "revoke_ack_poll_s",
        "idle_check_interval_s",
    ):
        if not getattr(values, name) > 0:
            raise ConfigError(f"consumer.{name} must be positive, got {getattr(values, name)}")
    for name in ("fetch_grace_s", "stall_fence_s"):
        if getattr(values, name) < 0:
            raise ConfigError(f"consumer.{name} must not be negative, got {getattr(values, name)}")


MIN_GC_YOUNG_THRESHOLD = 100

# aiokafka settings that ``kafka.security`` owns: refused in ``kafka.client``, so that no
# client is built with half of them (the group consumers once were).
_SECURITY_CLIENT_KEYS = {
    "security_protocol": "protocol",
    "ssl_context": "ssl_cafile",
    "ssl_cafile": "ssl_cafile",
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
    "ssl_password": "ssl_key_password",
    "sasl_mechanism": "sasl_mechanism",
    "sasl_plain_username": "sasl_username",
    "sasl_plain_password": "sasl_password",
    "sasl_oauth_token_provider": "oauth_token_endpoint",
}


def _check_file(name: str, path: str) -> None:
    """A file setting names a readable file (a missing or unreadable one is a
    configuration error, not a connection failure found later)."""
    if not path:
        return
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{name}: {path} does not exist or is not a file")
    if not os.access(file, os.R_OK):
        raise ConfigError(f"{name}: {path} is not readable by this process")


def _one_of(name: str, secret: Secret, file_name: str, path: str) -> None:
    if secret and path:
        raise ConfigError(f"set {name} or {file_name}, not both")
    _check_file(file_name, path)


def _validate_kafka_security(values: KafkaSettings) -> None:
    for key in values.client:
        if key in _SECURITY_CLIENT_KEYS:
            raise ConfigError(
                f"kafka.client.{key} is not passed through: set "
                f"kafka.security.{_SECURITY_CLIENT_KEYS[key]} instead"
            )
    security = values.security
    prefix = "kafka.security."
    if security.protocol not in KAFKA_PROTOCOLS:
        raise ConfigError(
            f"{prefix}protocol must be one of {', '.join(KAFKA_PROTOCOLS)}; "
            f"got {security.protocol!r}"
        )
    ssl_given = [
        name
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password_file")
        if getattr(security, name)
    ] + (["ssl_key_password"] if security.ssl_key_password else [])
    if ssl_given and not security.tls:
        raise ConfigError(
            f"{prefix}{ssl_given[0]} is set but {prefix}protocol is {security.protocol}: "
            "use SSL or SASL_SSL for TLS"
        )
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        _check_file(prefix + name, getattr(security, name))
    _one_of(
        prefix + "ssl_key_password",
        security.ssl_key_password,
        prefix + "ssl_key_password_file",
        security.ssl_key_password_file,
    )
    if bool(security.ssl_certfile) != bool(security.ssl_keyfile):
        raise ConfigError(
            f"{prefix}ssl_certfile and {prefix}ssl_keyfile go together (mutual TLS needs both)"
        )
    if not security.sasl:
        if security.sasl_mechanism:
            raise ConfigError(
                f"{prefix}sasl_mechanism is set but {prefix}protocol is {security.protocol}: "
                "use SASL_PLAINTEXT or SASL_SSL for SASL"
            )
        return
    if security.sasl_mechanism not in KAFKA_SASL_MECHANISMS:
        raise ConfigError(
            f"{prefix}sasl_mechanism must be one of {', '.join(KAFKA_SASL_MECHANISMS)} with "
            f"protocol {security.protocol}; got {security.sasl_mechanism!r}"
        )
    if security.sasl_mechanism == "OAUTHBEARER":
        _validate_oauth(security)
        return
    if not security.sasl_username:
        raise ConfigError(f"{prefix}sasl_username is needed for {security.sasl_mechanism}")
    _required_secret(
        prefix + "sasl_password",
        security.sasl_password,
        security.sasl_password_file,
        f"for {security.sasl_mechanism}",
    )


def _required_secret(name: str, value: Secret, file: str, needed: str) -> None:
    """Exactly one of ``name`` and ``name``_file must be set; ``needed`` says what for."""
    _one_of(name, value, name + "_file", file)
    if not (value or file):
        raise ConfigError(f"{name} or {name}_file is needed {needed}")


def _validate_oauth(security: KafkaSecuritySettings) -> None:
    prefix = "kafka.security."
    if security.oauth_token_file:
        if security.oauth_token_endpoint:
            raise ConfigError(
                f"set {prefix}oauth_token_endpoint or {prefix}oauth_token_file, not both"
            )
        _check_file(prefix + "oauth_token_file", security.oauth_token_file)
        return
    if not security.oauth_token_endpoint:
        raise ConfigError(
            f"OAUTHBEARER needs {prefix}oauth_token_endpoint (the client-credentials flow) "
            f"or {prefix}oauth_token_file"
        )
    if not security.oauth_token_endpoint.startswith(("https://", "http://")):
        raise ConfigError(f"{prefix}oauth_token_endpoint must be an http(s) URL")
    if not security.oauth_client_id:
        raise ConfigError(f"{prefix}oauth_client_id is needed with {prefix}oauth_token_endpoint")
    _required_secret(
        prefix + "oauth_client_secret",
        security.oauth_client_secret,
        security.oauth_client_secret_file,
        f"with {prefix}oauth_token_endpoint",
    )


def _validate_zookeeper_security(security: ZooKeeperSecuritySettings) -> None:
    prefix = "zookeeper.security."
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(security, name)
        if path and not security.tls:
            raise ConfigError(f"{prefix}{name} is set but {prefix}tls is false")
        _check_file(prefix + name, path)
    if bool(security.ssl_certfile) != bool(security.ssl_keyfile):
        raise ConfigError(f"{prefix}ssl_certfile and {prefix}ssl_keyfile go together")
    if security.sasl_mechanism not in ZOOKEEPER_SASL_MECHANISMS:
        raise ConfigError(
            f"{prefix}sasl_mechanism must be empty or DIGEST-MD5; got {security.sasl_mechanism!r}"
        )
    _one_of(
        prefix + "digest_password",
        security.digest_password,
        prefix + "digest_password_file",
        security.digest_password_file,
    )
    has_password = bool(security.digest_password or security.digest_password_file)
    if security.sasl_mechanism and not security.digest_username:
        raise ConfigError(f"{prefix}sasl_mechanism DIGEST-MD5 needs {prefix}digest_username")
    if bool(security.digest_username) != has_password:
        raise ConfigError(
            f"{prefix}digest_username and {prefix}digest_password (or "
            f"{prefix}digest_password_file) go together"
        )


def _validate(section: str, values: Any) -> None:
    if section == "produce" and values.header_format not in HEADER_FORMATS:
        raise ConfigError(
            f"produce.header_format must be one of {', '.join(HEADER_FORMATS)}; "
            f"got {values.header_format!r}"
        )
    if section == "process" and values.gc_young_threshold < MIN_GC_YOUNG_THRESHOLD:
        # 0 would switch the cycle collector off: cycles (tracebacks, futures) would leak.
        raise ConfigError(
            f"process.gc_young_threshold must be at least {MIN_GC_YOUNG_THRESHOLD}, "
            f"got {values.gc_young_threshold}"
        )
    if section == "http" and not 0 <= values.port <= 65535:
        raise ConfigError(f"http.port must be between 0 and 65535, got {values.port}")
    if section == "http" and values.admin_enabled and not values.admin_token:
        raise ConfigError(
            "http.admin_enabled needs http.admin_token (the admin API is token-protected)"
        )
    if section == "http":
        _validate_http_limits(values)
        _validate_listeners(values)
    if section == "startup":
        _validate_startup(values)
    if section == "log":
        _validate_log(values)
    if section == "zookeeper" and not values.root.startswith("/"):
        raise ConfigError(f"zookeeper.root must be an absolute path, got {values.root!r}")
    if section == "audit" and not 0.0 <= values.sample_rate <= 1.0:
        raise ConfigError(f"audit.sample_rate must be between 0 and 1, got {values.sample_rate}")
    if section == "faults" and values.kill_after_phase:
        from sidecar.core.procedures import Phase

        if values.kill_after_phase not in {phase.value for phase in Phase}:
            raise ConfigError(f"faults.kill_after_phase is not a phase: {values.kill_after_phase}")
    if section == "zookeeper" and values.session_timeout_s <= 0:
        raise ConfigError("zookeeper.session_timeout_s must be positive")
    if section == "kafka" and min(values.request_timeout_ms, values.transaction_timeout_ms) <= 0:
        raise ConfigError(
            "kafka.request_timeout_ms and kafka.transaction_timeout_ms must be positive"
        )
    if section == "consumer":
        _validate_consumer(values)
    if section == "kafka":
        _validate_kafka_security(values)
    if section == "zookeeper":
        _validate_zookeeper_security(values.security)
    if section in _POSITIVE:
        _validate_positive(section, values)
    if section == "kafka" and values.replication_margin_ms < 0:
        raise ConfigError("kafka.replication_margin_ms must not be negative")
