from __future__ import annotations

import gc
import os
import re
from pathlib import Path

import pytest

from sidecar.commands.serve import tune_process
from sidecar.config import ConfigError, ProcessSettings, load_settings


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.toml"
    path.write_text(text)
    return path


def test_defaults_bind_loopback_and_disable_admin() -> None:
    settings = load_settings(environ={})
    assert settings.http.host == "127.0.0.1"
    assert settings.http.admin_enabled is False
    assert settings.zookeeper.root == "/ordered"
    assert settings.sidecar_id


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        'sidecar_id = "a"\n[kafka]\nbootstrap_servers = "file:9092"\n[http]\nport = 9000\n',
    )
    settings = load_settings(
        path,
        environ={
            "ORDERED_SIDECAR__KAFKA__BOOTSTRAP_SERVERS": "env:9092",
            "ORDERED_SIDECAR__ZOOKEEPER__SESSION_TIMEOUT_S": "16.5",
            "ORDERED_SIDECAR__HTTP__ADMIN_ENABLED": "yes",
            "ORDERED_SIDECAR__HTTP__ADMIN_TOKEN": "t0ken",
            "ORDERED_SIDECAR__KAFKA__SECURITY__PROTOCOL": "SASL_PLAINTEXT",
            "ORDERED_SIDECAR__KAFKA__SECURITY__SASL_MECHANISM": "PLAIN",
            "ORDERED_SIDECAR__KAFKA__SECURITY__SASL_USERNAME": "app",
            "ORDERED_SIDECAR__KAFKA__SECURITY__SASL_PASSWORD": "hunter2",
            "ORDERED_SIDECAR__KAFKA__CLIENT__LINGER_MS": "5",
            "UNRELATED": "x",
        },
    )
    assert settings.sidecar_id == "a"
    assert settings.kafka.bootstrap_servers == "env:9092"
    assert settings.http.port == 9000
    assert settings.zookeeper.session_timeout_s == 16.5
    assert settings.http.admin_enabled is True
    assert settings.kafka.client == {"linger_ms": "5"}
    assert settings.kafka.security.password() == "hunter2"
    assert "hunter2" not in repr(settings)
    assert "t0ken" not in repr(settings)


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        ("[nope]\nx = 1\n", {}, "unknown configuration section 'nope'"),
        ('sidecar_id = "a/b"\n', {}, "'a/b' is not a sidecar id"),
        ("", {"ORDERED_SIDECAR__SIDECAR_ID": "host:1"}, "'host:1' is not a sidecar id"),
        ("[http]\nprot = 1\n", {}, "unknown setting http.prot"),
        ("[http]\nport = 1.5\n", {}, "http.port must be a int"),
        ("[http]\nport = true\n", {}, "http.port must be a int"),
        ("", {"ORDERED_SIDECAR__HTTP__PORT": "eighty"}, "http.port must be a int"),
        ("", {"ORDERED_SIDECAR__HTTP__ADMIN_ENABLED": "maybe"}, "http.admin_enabled must be"),
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
        ("[kafka]\nclient = 3\n", {}, "kafka.client must be a table"),
        ("[http\n", {}, "not valid TOML"),
        (
            "[zookeeper]\nsession_timeout_s = 10\n",
            {},
            "zookeeper.session_timeout_s (10 s) must exceed kafka.request_timeout_ms "
            "+ kafka.replication_margin_ms (12 s)",
        ),
        (
            "[kafka]\nrequest_timeout_ms = 30000\n",
            {},
            "zookeeper.session_timeout_s (15 s) must exceed",
        ),
        (
            "[zookeeper]\nsession_timeout_s = 25\n",
            {},
            "produce.barrier_timeout_s (20 s) must exceed zookeeper.session_timeout_s (25 s)",
        ),
        (
            "[kafka]\ntransaction_timeout_ms = 5000\n",
            {},
            "kafka.transaction_timeout_ms (5000) must exceed kafka.request_timeout_ms",
        ),
        (
            "[produce]\nunmanaged_cache_s = 15\n",
            {},
            "produce.unmanaged_cache_s (15 s) must be at least 0 and less than "
            "zookeeper.session_timeout_s (15 s)",
        ),
        ('sidecar_id = "a/b"\n', {}, "sidecar_id"),
        ('sidecar_id = "a~b"\n', {}, "'a~b' is not a sidecar id"),
        ('[kafka]\nclient_id = "my app"\n', {}, "kafka.client_id 'my app' cannot name"),
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
        load_settings(_write(tmp_path, text), environ=environ)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "absent.toml", environ={})


def test_the_default_timing_keeps_the_zombie_argument() -> None:
    """The defaults must pass their own rule: a session outlives every send."""
    settings = load_settings(environ={})
    assert settings.zookeeper.session_timeout_s * 1000 > (
        settings.kafka.request_timeout_ms + settings.kafka.replication_margin_ms
    )
    assert settings.produce.barrier_timeout_s > settings.zookeeper.session_timeout_s


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        (
            {"ORDERED_SIDECAR__CHANGES__HOUSEKEEPING_INTERVAL_S": "25"},
            "changes.housekeeping_interval_s",
        ),
        ({"ORDERED_SIDECAR__ZOOKEEPER__LOCK_POLL_S": "10"}, "zookeeper.lock_poll_s"),
        ({"ORDERED_SIDECAR__CONSUMER__GATE_RECHECK_S": "400"}, "consumer.gate_recheck_s"),
        ({"ORDERED_SIDECAR__CONSUMER__BUFFER_LIMIT": "0"}, "consumer.buffer_limit"),
        ({"ORDERED_SIDECAR__CHANGES__ACTION_RETRY_S": "0"}, "changes.action_retry_s"),
        ({"ORDERED_SIDECAR__AUDIT__BATCH_SIZE": "-1"}, "audit.batch_size"),
        ({"ORDERED_SIDECAR__KAFKA__TRANSACTION_LANES": "0"}, "kafka.transaction_lanes"),
        ({"ORDERED_SIDECAR__KAFKA__TRANSACTION_LANES": "9"}, "kafka.transaction_lanes"),
        ({"ORDERED_SIDECAR__PROCESS__GC_YOUNG_THRESHOLD": "0"}, "process.gc_young_threshold"),
        ({"ORDERED_SIDECAR__PROCESS__EVENT_LOOP": "trio"}, "process.event_loop"),
    ],
)
def test_related_and_out_of_range_tunables_are_refused(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_settings(environ=environ)


def test_the_tunables_default_to_the_values_the_code_had() -> None:
    settings = load_settings(environ={})
    assert settings.consumer.gate_recheck_s == 0.05
    assert settings.consumer.buffer_limit == 2000
    assert settings.consumer.instance_idle_timeout_s == 300.0
    assert settings.changes.housekeeping_interval_s == 2.0
    assert settings.changes.lock_timeout_s == 10.0
    assert settings.http.shutdown_grace_s == 30.0
    assert settings.zookeeper.transaction_attempts == 5


def test_the_process_setting_sets_the_youngest_generation_only() -> None:
    before = gc.get_threshold()
    try:
        tune_process(ProcessSettings(gc_young_threshold=12_345))
        assert gc.get_threshold() == (12_345, before[1], before[2])
    finally:
        gc.set_threshold(*before)


def test_security_sections_load_from_toml_and_environment(tmp_path: Path) -> None:
    password = tmp_path / "zk-password"
    password.write_text("zk-s3cret\n")
    path = _write(
        tmp_path,
        "[kafka.security]\n"
        'protocol = "SASL_SSL"\n'
        'sasl_mechanism = "SCRAM-SHA-256"\n'
        'sasl_username = "orders"\n'
        "[zookeeper.security]\n"
        'sasl_mechanism = "DIGEST-MD5"\n'
        'digest_username = "sidecar"\n'
        f'digest_password_file = "{password}"\n',
    )
    settings = load_settings(
        path,
        environ={
            "ORDERED_SIDECAR__KAFKA__SECURITY__SASL_PASSWORD": "kafka-s3cret",
            "ORDERED_SIDECAR__KAFKA__SECURITY__SSL_CHECK_HOSTNAME": "false",
            "ORDERED_SIDECAR__ZOOKEEPER__SECURITY__WORLD_READABLE": "no",
        },
    )
    kafka = settings.kafka.security
    assert (kafka.protocol, kafka.sasl_mechanism, kafka.sasl_username) == (
        "SASL_SSL",
        "SCRAM-SHA-256",
        "orders",
    )
    assert kafka.ssl_check_hostname is False
    assert kafka.password() == "kafka-s3cret"
    zookeeper = settings.zookeeper.security
    assert zookeeper.password() == "zk-s3cret"
    assert zookeeper.world_readable is False
    for secret in ("kafka-s3cret", "zk-s3cret"):
        assert secret not in repr(settings)
        assert secret not in str(settings)


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
