from __future__ import annotations

import gc
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
            "ORDERED_SIDECAR__KAFKA__CLIENT__SASL_PLAIN_PASSWORD": "hunter2",
            "UNRELATED": "x",
        },
    )
    assert settings.sidecar_id == "a"
    assert settings.kafka.bootstrap_servers == "env:9092"
    assert settings.http.port == 9000
    assert settings.zookeeper.session_timeout_s == 16.5
    assert settings.http.admin_enabled is True
    assert settings.kafka.client == {"sasl_plain_password": "hunter2"}
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
