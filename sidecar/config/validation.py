"""The checks of each section as it is loaded (``_validate``): ranges, choices, files
that must be readable, and the security settings that go together or exclude each
other. The checks that span sections are ``Settings.validate``'s."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

from sidecar.config.clusters import KafkaSettings
from sidecar.config.errors import ConfigError
from sidecar.config.operations import LOG_FORMATS, LOG_LEVELS, LogSettings, StartupSettings
from sidecar.config.security import (
    KAFKA_PROTOCOLS,
    KAFKA_SASL_MECHANISMS,
    ZOOKEEPER_SASL_MECHANISMS,
    KafkaSecuritySettings,
    Secret,
    ZooKeeperSecuritySettings,
)
from sidecar.config.serving import ACCESS_LOG_MODES, HEADER_FORMATS, ConsumerSettings, HttpSettings


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
        "compaction_batch",
    ),
    "zookeeper": (
        "lock_poll_s",
        "transaction_attempts",
        "topic_list_interval_s",
        "read_concurrency",
    ),
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
        "reading_start_wait_s",
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
EVENT_LOOPS = ("auto", "asyncio", "uvloop")

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
    if not 0 < security.oauth_refresh_fraction <= 1:
        raise ConfigError(f"{prefix}oauth_refresh_fraction must be above 0 and at most 1")
    if not security.oauth_default_lifetime_s > 0:
        raise ConfigError(f"{prefix}oauth_default_lifetime_s must be positive")
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
    if section == "process" and values.event_loop not in EVENT_LOOPS:
        raise ConfigError(
            f"process.event_loop must be one of {', '.join(EVENT_LOOPS)}; got {values.event_loop!r}"
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
    if section == "changes" and values.compaction_interval_s < 0:
        raise ConfigError(
            f"changes.compaction_interval_s must not be negative (0: off), got "
            f"{values.compaction_interval_s}"
        )
    if section == "kafka" and values.replication_margin_ms < 0:
        raise ConfigError("kafka.replication_margin_ms must not be negative")
    if section == "kafka" and not 0 <= values.transaction_linger_ms < values.request_timeout_ms:
        raise ConfigError(
            f"kafka.transaction_linger_ms must be from 0 (off) to below "
            f"kafka.request_timeout_ms, got {values.transaction_linger_ms}"
        )
