"""``sidecar.config.validation``: each section's checks as it is loaded (ranges,
choices, listeners, files that must be readable, security settings that go together or
exclude each other), each refusal naming the setting."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sidecar.config import ConfigError, load_settings
from tests.unit.config.support import config_file


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        ("[http]\nport = 70000\n", {}, "between 0 and 65535"),
        ("[http]\nmax_connections = 0\n", {}, "http.max_connections must be at least 1"),
        ("[http]\nheader_read_timeout_s = 0\n", {}, "header_read_timeout_s must be positive"),
        ("", {"ORDERED_SIDECAR__HTTP__BODY_READ_TIMEOUT_S": "nan"}, "must be positive"),
        ("[http]\nkeepalive_timeout_s = -1\n", {}, "keepalive_timeout_s must be positive"),
        ("[http]\nadmin_enabled = true\n", {}, "needs http.admin_token"),
        ('[http]\naccess_log = "some"\n', {}, "http.access_log must be one of off, errors, all"),
        ("[http]\nops_port = 70000\n", {}, "http.ops_port must be between 0 and 65535"),
        ("[http]\nport = 9000\nops_port = 9000\n", {}, "http.ops_port (9000) must differ"),
        ('[http]\nhost = "0.0.0.0"\n', {}, "not a loopback address: set http.data_token"),
        ('[http]\nhost = "10.1.2.3"\n', {}, "not a loopback address: set http.data_token"),
        ("[startup]\nretry_initial_s = 0\n", {}, "startup.retry_initial_s (0) must be positive"),
        ("[startup]\nretry_initial_s = 3\n", {}, "at most startup.retry_max_s (2)"),
        (
            '[produce]\nheader_format = "four"\n',
            {},
            "produce.header_format must be one of stamp, separate; got 'four'",
        ),
        ('[zookeeper]\nroot = "ordered"\n', {}, "absolute path"),
        ("[kafka]\ntransaction_linger_ms = -1\n", {}, "kafka.transaction_linger_ms must be"),
        (
            "",
            {"ORDERED_SIDECAR__KAFKA__TRANSACTION_LINGER_MS": "nan"},
            "kafka.transaction_linger_ms must be from 0 (off) to below",
        ),
        (
            "[kafka]\nrequest_timeout_ms = 1000\ntransaction_linger_ms = 1000\n",
            {},
            "below kafka.request_timeout_ms, got 1000",
        ),
        ("[produce]\nstream_max_in_flight = 0\n", {}, "produce.stream_max_in_flight must be"),
        (
            "",
            {"ORDERED_SIDECAR__PRODUCE__STREAM_IDLE_TIMEOUT_S": "nan"},
            "produce.stream_idle_timeout_s must be positive",
        ),
    ],
)
def test_bad_settings_are_refused_with_the_setting_named(
    tmp_path: Path, text: str, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(config_file(tmp_path, text), environ=environ)


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"ORDERED_SIDECAR__CONSUMER__BUFFER_LIMIT": "0"}, "consumer.buffer_limit"),
        ({"ORDERED_SIDECAR__CHANGES__ACTION_RETRY_S": "0"}, "changes.action_retry_s"),
        (
            {"ORDERED_SIDECAR__CHANGES__COMPACTION_INTERVAL_S": "-1"},
            "changes.compaction_interval_s",
        ),
        ({"ORDERED_SIDECAR__CHANGES__COMPACTION_BATCH": "0"}, "changes.compaction_batch"),
        ({"ORDERED_SIDECAR__AUDIT__BATCH_SIZE": "-1"}, "audit.batch_size"),
        ({"ORDERED_SIDECAR__PROCESS__GC_YOUNG_THRESHOLD": "0"}, "process.gc_young_threshold"),
        ({"ORDERED_SIDECAR__PROCESS__EVENT_LOOP": "trio"}, "process.event_loop"),
    ],
)
def test_related_and_out_of_range_tunables_are_refused(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_settings(environ=environ)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"PROTOCOL": "TLS"}, "kafka.security.protocol must be one of"),
        ({"SSL_CAFILE": "/nonexistent/ca.pem"}, "kafka.security.ssl_cafile is set but"),
        (
            {"PROTOCOL": "SSL", "SSL_CAFILE": "/nonexistent/ca.pem"},
            "kafka.security.ssl_cafile: /nonexistent/ca.pem does not exist",
        ),
        ({"PROTOCOL": "SSL", "SSL_CERTFILE": "{file}"}, "ssl_certfile and kafka.security.ssl_key"),
        ({"PROTOCOL": "SASL_SSL"}, "kafka.security.sasl_mechanism must be one of"),
        (
            {"PROTOCOL": "SASL_SSL", "SASL_MECHANISM": "PLAIN", "SASL_USERNAME": "u"},
            "kafka.security.sasl_password or kafka.security.sasl_password_file is needed",
        ),
        (
            {
                "PROTOCOL": "SASL_SSL",
                "SASL_MECHANISM": "PLAIN",
                "SASL_USERNAME": "u",
                "SASL_PASSWORD": "p",
                "SASL_PASSWORD_FILE": "{file}",
            },
            "set kafka.security.sasl_password or kafka.security.sasl_password_file, not both",
        ),
        (
            {"PROTOCOL": "SASL_SSL", "SASL_MECHANISM": "OAUTHBEARER"},
            "OAUTHBEARER needs kafka.security.oauth_token_endpoint",
        ),
        (
            {
                "PROTOCOL": "SASL_SSL",
                "SASL_MECHANISM": "OAUTHBEARER",
                "OAUTH_TOKEN_ENDPOINT": "https://idp.example/token",
                "OAUTH_REFRESH_FRACTION": "1.5",
            },
            "kafka.security.oauth_refresh_fraction must be above 0 and at most 1",
        ),
        (
            {
                "PROTOCOL": "SASL_SSL",
                "SASL_MECHANISM": "OAUTHBEARER",
                "OAUTH_TOKEN_FILE": "{file}",
                "OAUTH_DEFAULT_LIFETIME_S": "0",
            },
            "kafka.security.oauth_default_lifetime_s must be positive",
        ),
        (
            {"PROTOCOL": "PLAINTEXT", "SASL_MECHANISM": "PLAIN"},
            "kafka.security.sasl_mechanism is set but kafka.security.protocol is PLAINTEXT",
        ),
    ],
)
def test_kafka_security_mistakes_name_the_setting(
    tmp_path: Path, environ: dict[str, str], message: str
) -> None:
    existing = tmp_path / "file.pem"
    existing.write_text("x")
    full = {
        f"ORDERED_SIDECAR__KAFKA__SECURITY__{key}": value.format(file=existing)
        for key, value in environ.items()
    }
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(environ=full)


def test_an_unreadable_secret_file_names_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "password"
    secret.write_text("x")
    secret.chmod(0)
    # Root reads any file: ask os.access as an ordinary user would be answered.
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != secret)
    environ = {
        "ORDERED_SIDECAR__KAFKA__SECURITY__PROTOCOL": "SASL_SSL",
        "ORDERED_SIDECAR__KAFKA__SECURITY__SASL_MECHANISM": "SCRAM-SHA-512",
        "ORDERED_SIDECAR__KAFKA__SECURITY__SASL_USERNAME": "u",
        "ORDERED_SIDECAR__KAFKA__SECURITY__SASL_PASSWORD_FILE": str(secret),
    }
    with pytest.raises(ConfigError, match=r"kafka\.security\.sasl_password_file: .* not readable"):
        load_settings(environ=environ)


def test_security_keys_in_the_pass_through_table_point_to_the_security_section() -> None:
    with pytest.raises(ConfigError, match=r"set kafka\.security\.ssl_cafile instead"):
        load_settings(environ={"ORDERED_SIDECAR__KAFKA__CLIENT__SSL_CAFILE": "/etc/ca.pem"})


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SASL_MECHANISM": "GSSAPI"}, "must be empty or DIGEST-MD5"),
        ({"SASL_MECHANISM": "DIGEST-MD5"}, "DIGEST-MD5 needs zookeeper.security.digest_username"),
        ({"DIGEST_USERNAME": "u"}, "digest_username and zookeeper.security.digest_password"),
        ({"SSL_CAFILE": "/etc/hostname"}, "zookeeper.security.ssl_cafile is set but"),
    ],
)
def test_zookeeper_security_mistakes_name_the_setting(
    environ: dict[str, str], message: str
) -> None:
    full = {f"ORDERED_SIDECAR__ZOOKEEPER__SECURITY__{k}": v for k, v in environ.items()}
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(environ=full)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_data_plane_needs_no_token(host: str) -> None:
    settings = load_settings(None, {"ORDERED_SIDECAR__HTTP__HOST": host})
    assert settings.http.host == host
    assert settings.http.data_token == ""


def test_a_data_plane_beyond_loopback_binds_with_its_token() -> None:
    settings = load_settings(
        None,
        {"ORDERED_SIDECAR__HTTP__HOST": "0.0.0.0", "ORDERED_SIDECAR__HTTP__DATA_TOKEN": "s3cret"},
    )
    assert settings.http.host == "0.0.0.0"
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"ORDERED_SIDECAR__LOG__FORMAT": "xml"}, "log.format must be one of text, json"),
        ({"ORDERED_SIDECAR__LOG__LEVEL": "loud"}, "log.level must be one of DEBUG"),
    ],
)
def test_unknown_log_values_are_configuration_errors(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(None, environ)
