"""``sidecar.config.settings``: the checks that span sections (``Settings.validate``),
which keep the timing the design rests on, and the defaults that pass them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.config import ConfigError, load_settings
from tests.unit.config.support import config_file


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        ('sidecar_id = "a/b"\n', {}, "'a/b' is not a sidecar id"),
        ("", {"ORDERED_SIDECAR__SIDECAR_ID": "host:1"}, "'host:1' is not a sidecar id"),
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
    ],
)
def test_bad_settings_are_refused_with_the_setting_named(
    tmp_path: Path, text: str, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(config_file(tmp_path, text), environ=environ)


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
        ({"ORDERED_SIDECAR__KAFKA__TRANSACTION_LANES": "0"}, "kafka.transaction_lanes"),
        ({"ORDERED_SIDECAR__KAFKA__TRANSACTION_LANES": "9"}, "kafka.transaction_lanes"),
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
