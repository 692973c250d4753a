"""``sidecar.config.security``: secrets that ``repr`` and ``str`` never show, the
security sections' derived flags, and secrets read from their ``*_file`` settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import ConfigError, KafkaSecuritySettings, Secret, ZooKeeperSecuritySettings


def test_a_secret_is_redacted_when_shown_and_given_by_reveal() -> None:
    secret = Secret("hunter2")
    assert repr(secret) == str(secret) == "Secret('***')"
    assert f"{secret}" == "Secret('***')"
    assert "hunter2" not in repr([secret, {"k": secret}])
    assert secret.reveal() == "hunter2"


def test_an_empty_secret_is_shown_empty_and_is_false() -> None:
    assert repr(Secret()) == "Secret('')"
    assert not Secret()
    assert not Secret("")
    assert Secret("x")


def test_secrets_are_equal_by_their_text_and_never_equal_a_plain_string() -> None:
    assert Secret("a") == Secret("a")
    assert hash(Secret("a")) == hash(Secret("a"))
    assert Secret("a") != Secret("b")
    assert Secret("a") != "a"


@pytest.mark.parametrize(
    ("protocol", "tls", "sasl"),
    [
        ("PLAINTEXT", False, False),
        ("SSL", True, False),
        ("SASL_PLAINTEXT", False, True),
        ("SASL_SSL", True, True),
    ],
)
def test_the_kafka_protocol_says_whether_tls_and_sasl_are_used(
    protocol: str, tls: bool, sasl: bool
) -> None:
    security = KafkaSecuritySettings(protocol=protocol)
    assert (security.tls, security.sasl) == (tls, sasl)


def test_a_password_given_inline_is_revealed() -> None:
    security = KafkaSecuritySettings(sasl_password=Secret("inline"))
    assert security.password() == "inline"
    assert security.client_secret() == ""
    assert security.key_password() is None


def test_a_secret_file_is_read_each_time_and_stripped(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("first\n")
    security = KafkaSecuritySettings(sasl_password_file=str(path))
    assert security.password() == "first"
    path.write_text("  rotated \n")  # a platform agent rotated it
    assert security.password() == "rotated"


def test_each_kafka_secret_reads_its_own_file(tmp_path: Path) -> None:
    files = {}
    for name in ("key", "client", "sasl"):
        files[name] = tmp_path / name
        files[name].write_text(f"{name}-secret")
    security = KafkaSecuritySettings(
        ssl_key_password_file=str(files["key"]),
        oauth_client_secret_file=str(files["client"]),
        sasl_password_file=str(files["sasl"]),
    )
    assert security.key_password() == "key-secret"
    assert security.client_secret() == "client-secret"
    assert security.password() == "sasl-secret"


def test_a_secret_file_that_went_away_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "gone"
    security = KafkaSecuritySettings(sasl_password_file=str(path))
    with pytest.raises(ConfigError, match=f"cannot read {path}: No such file"):
        security.password()


def test_zookeeper_is_authenticated_once_a_digest_user_is_named(tmp_path: Path) -> None:
    assert not ZooKeeperSecuritySettings().authenticated
    path = tmp_path / "zk"
    path.write_text("zk-secret\n")
    security = ZooKeeperSecuritySettings(digest_username="sidecar", digest_password_file=str(path))
    assert security.authenticated
    assert security.password() == "zk-secret"
    assert ZooKeeperSecuritySettings(digest_password=Secret("p")).password() == "p"


def test_the_security_sections_show_no_secret() -> None:
    kafka = KafkaSecuritySettings(
        sasl_password=Secret("s1"),
        oauth_client_secret=Secret("s2"),
        ssl_key_password=Secret("s3"),
    )
    zookeeper = ZooKeeperSecuritySettings(digest_password=Secret("s4"))
    shown = repr(kafka) + str(kafka) + repr(zookeeper) + str(zookeeper)
    for secret in ("s1", "s2", "s3", "s4"):
        assert f"'{secret}'" not in shown
