"""``sidecar.config.loading``: settings read from a TOML file and the environment (the
environment wins), each value converted to its field's type, and what cannot be read
refused with the setting named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.config import ConfigError, load_settings
from tests.unit.config.support import config_file


def test_defaults_bind_loopback_and_disable_admin() -> None:
    settings = load_settings(environ={})
    assert settings.http.host == "127.0.0.1"
    assert settings.http.admin_enabled is False
    assert settings.zookeeper.root == "/ordered"
    assert settings.sidecar_id


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = config_file(
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
        ("[http]\nprot = 1\n", {}, "unknown setting http.prot"),
        ("[http]\nport = 1.5\n", {}, "http.port must be a int"),
        ("[http]\nport = true\n", {}, "http.port must be a int"),
        ("", {"ORDERED_SIDECAR__HTTP__PORT": "eighty"}, "http.port must be a int"),
        ("", {"ORDERED_SIDECAR__HTTP__ADMIN_ENABLED": "maybe"}, "http.admin_enabled must be"),
        ("[kafka]\nclient = 3\n", {}, "kafka.client must be a table"),
        ("[http\n", {}, "not valid TOML"),
    ],
)
def test_bad_settings_are_refused_with_the_setting_named(
    tmp_path: Path, text: str, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(config_file(tmp_path, text), environ=environ)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "absent.toml", environ={})


def test_security_sections_load_from_toml_and_environment(tmp_path: Path) -> None:
    password = tmp_path / "zk-password"
    password.write_text("zk-s3cret\n")
    path = config_file(
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
