"""``sidecar.config.serving``: the ``http``, ``produce``, ``changes`` and ``consumer``
sections. Their checks as they are loaded are ``test_validation``'s, their defaults are
pinned by ``tests/unit/test_settings_table.py`` (the README's table); here: the choices
they offer, what their ``repr`` hides, and the relations between defaults that their
documentation promises."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest

from sidecar.config import (
    ACCESS_LOG_MODES,
    HEADER_FORMATS,
    ChangeSettings,
    ConsumerSettings,
    HttpSettings,
    ProduceSettings,
)
from sidecar.core.placement import HeaderFormat


def test_the_header_formats_are_exactly_the_placement_formats() -> None:
    # The produce service builds ``HeaderFormat(settings.produce.header_format)``: every
    # accepted value must convert, and every format must be choosable.
    assert {HeaderFormat(value) for value in HEADER_FORMATS} == set(HeaderFormat)
    assert len(HEADER_FORMATS) == len(HeaderFormat)


def test_records_are_stamped_by_default() -> None:
    assert HeaderFormat(ProduceSettings().header_format) is HeaderFormat.STAMP


def test_the_access_log_modes_and_their_default() -> None:
    assert ACCESS_LOG_MODES == ("off", "errors", "all")
    assert HttpSettings().access_log == "errors"


def test_the_http_tokens_are_never_shown() -> None:
    shown = repr(HttpSettings(admin_token="adm1n-t0ken", data_token="d4ta-t0ken", port=9000))
    assert "adm1n-t0ken" not in shown
    assert "d4ta-t0ken" not in shown
    assert "admin_token" not in shown
    assert "data_token" not in shown
    # The rest is shown: it says where the sidecar listens.
    assert "port=9000" in shown
    assert "host='127.0.0.1'" in shown


def test_both_listeners_default_to_loopback_on_ports_of_their_own() -> None:
    http = HttpSettings()
    # Loopback: the data plane needs no data_token by default; the ops listener is
    # reachable by nothing outside the host until the deployment says so.
    assert ipaddress.ip_address(http.host).is_loopback
    assert ipaddress.ip_address(http.ops_host).is_loopback
    assert http.port != http.ops_port
    assert http.admin_enabled is False


@pytest.mark.parametrize(
    "section", [HttpSettings(), ProduceSettings(), ChangeSettings(), ConsumerSettings()]
)
def test_the_sections_are_frozen(section: object) -> None:
    # One settings object is shared by every component: none may change it for the others.
    first = dataclasses.fields(section)[0].name  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(section, first, getattr(section, first))


def test_a_changed_copy_leaves_the_original_alone() -> None:
    original = ConsumerSettings()
    changed = dataclasses.replace(original, buffer_limit=7)
    assert changed.buffer_limit == 7
    assert original.buffer_limit == ConsumerSettings().buffer_limit != 7


def test_retirement_holds_the_topic_lock_more_briefly_than_a_change_waits_for_it() -> None:
    changes = ChangeSettings()
    assert 0 < changes.retirement_lock_timeout_s < changes.lock_timeout_s
    assert 0 < changes.barrier_poll_s < changes.action_retry_s


def test_the_consumer_polls_and_retries_more_often_than_it_gives_up() -> None:
    consumer = ConsumerSettings()
    assert consumer.revoke_ack_poll_s < consumer.revoke_ack_wait_s
    assert consumer.callback_retry_s < consumer.callback_patience_s
    assert consumer.gate_recheck_s < consumer.instance_idle_timeout_s
    assert consumer.idle_check_interval_s < consumer.instance_idle_timeout_s


def test_the_stall_fence_is_on_and_below_kafkas_default_session_timeout() -> None:
    # Kafka's consumer session.timeout.ms defaults to 10 s: a stall that long may have
    # cost this sidecar its partitions.
    assert 0 < ConsumerSettings().stall_fence_s < 10.0


def test_http_closes_unread_bodies_sooner_than_aiohttp_would() -> None:
    # aiohttp's own lingering_time is 10 s.
    http = HttpSettings()
    assert 0 < http.lingering_time_s < 10.0
    assert http.refusal_linger_s > 0
