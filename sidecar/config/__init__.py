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

The package, one concern a module: the sections by area (``clusters``: kafka and
zookeeper; ``security``: their security tables and ``Secret``; ``serving``: http,
produce, changes and consumer; ``operations``: metrics, audit, process, startup, log
and faults), ``settings`` (``Settings``, which holds them), ``loading``, ``validation``
and ``errors`` (``ConfigError``). The rest of the sidecar imports what it needs from
here.
"""

from sidecar.config.clusters import MAX_TRANSACTION_LANES, KafkaSettings, ZooKeeperSettings
from sidecar.config.errors import ConfigError
from sidecar.config.loading import ENV_PREFIX, default_sidecar_id, load_settings
from sidecar.config.operations import (
    LOG_FORMATS,
    LOG_LEVELS,
    AuditSettings,
    FaultSettings,
    LogSettings,
    MetricsSettings,
    ProcessSettings,
    StartupSettings,
)
from sidecar.config.security import (
    KAFKA_PROTOCOLS,
    KAFKA_SASL_MECHANISMS,
    ZOOKEEPER_SASL_MECHANISMS,
    KafkaSecuritySettings,
    Secret,
    ZooKeeperSecuritySettings,
)
from sidecar.config.serving import (
    ACCESS_LOG_MODES,
    HEADER_FORMATS,
    ChangeSettings,
    ConsumerSettings,
    HttpSettings,
    ProduceSettings,
)
from sidecar.config.settings import _SECTIONS, Settings
from sidecar.config.validation import MIN_GC_YOUNG_THRESHOLD

__all__ = [
    "ACCESS_LOG_MODES",
    "ENV_PREFIX",
    "HEADER_FORMATS",
    "KAFKA_PROTOCOLS",
    "KAFKA_SASL_MECHANISMS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MAX_TRANSACTION_LANES",
    "MIN_GC_YOUNG_THRESHOLD",
    "ZOOKEEPER_SASL_MECHANISMS",
    "_SECTIONS",
    "AuditSettings",
    "ChangeSettings",
    "ConfigError",
    "ConsumerSettings",
    "FaultSettings",
    "HttpSettings",
    "KafkaSecuritySettings",
    "KafkaSettings",
    "LogSettings",
    "MetricsSettings",
    "ProcessSettings",
    "ProduceSettings",
    "Secret",
    "Settings",
    "StartupSettings",
    "ZooKeeperSecuritySettings",
    "ZooKeeperSettings",
    "default_sidecar_id",
    "load_settings",
]
