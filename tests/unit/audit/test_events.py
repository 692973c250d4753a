"""Audit events, schema version 1 (``sidecar.audit.events``): every builder's fields, keys
in base64, the stamp a delivered record is traced by, what ``stamped`` adds, and which
keys are sampled."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.audit.events import (
    SCHEMA_VERSION,
    Event,
    admin,
    barrier_phase,
    boundary_truncated,
    committed,
    delivered,
    gate_opened,
    key_sampled,
    produce_acked,
    stamped,
    truncation_confirmed,
)
from sidecar.core.placement import (
    COUNT_HEADER,
    GENERATION_HEADER,
    SEQUENCE_HEADER,
    SIDECAR_HEADER,
    STAMP_HEADER,
    Header,
    HeaderFormat,
    sidecar_headers,
)
from sidecar.core.routing import positive_hash


def delivered_with(headers: list[Header], key: bytes | None = b"k") -> Event:
    return delivered(
        group="g", instance="i-1", topic="orders", partition=2, offset=40, key=key, headers=headers
    )


# Record events ---------------------------------------------------------------------------


def test_produce_acked_has_the_records_place_and_stamp() -> None:
    event = produce_acked(
        topic="orders",
        partition=3,
        offset=2**63 - 1,
        key=b"user-1",
        generation=4,
        count=6,
        producer="sidecar-a",
        producer_seq=17,
    )
    assert event == {
        "type": "produce_acked",
        "topic": "orders",
        "partition": 3,
        "offset": 9223372036854775807,
        "key": "dXNlci0x",
        "generation": 4,
        "count": 6,
        "producer": "sidecar-a",
        "producer_seq": 17,
    }


@pytest.mark.parametrize("header_format", list(HeaderFormat))
def test_delivered_traces_the_record_by_its_stamp_in_either_header_format(
    header_format: HeaderFormat,
) -> None:
    headers = [("trace", b"t"), *sidecar_headers(5, 8, "sidecar-b", 123, header_format)]
    assert delivered_with(headers) == {
        "type": "delivered",
        "group": "g",
        "instance": "i-1",
        "topic": "orders",
        "partition": 2,
        "offset": 40,
        "key": "aw==",
        "generation": 5,
        "producer": "sidecar-b",
        "producer_seq": 123,
        "ordered": True,
        "assignment": None,
    }


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("trace", b"t")],
        [(STAMP_HEADER, None)],
        [(STAMP_HEADER, b"5 8 sidecar-b")],
        [(STAMP_HEADER, b"x 8 sidecar-b 1")],
        # Older sidecars' headers, one missing or not a number.
        [(GENERATION_HEADER, b"5"), (COUNT_HEADER, b"8"), (SIDECAR_HEADER, b"s")],
        [
            (GENERATION_HEADER, b"five"),
            (COUNT_HEADER, b"8"),
            (SIDECAR_HEADER, b"s"),
            (SEQUENCE_HEADER, b"1"),
        ],
    ],
    ids=[
        "no-headers",
        "app-headers",
        "null-stamp",
        "short-stamp",
        "bad-stamp",
        "no-sequence",
        "bad-generation",
    ],
)
def test_delivered_without_a_readable_stamp_has_null_generation_and_producer(
    headers: list[Header],
) -> None:
    event = delivered_with(headers)
    assert (event["generation"], event["producer"], event["producer_seq"]) == (None, None, None)
    # The record is still told: where it was and which key.
    assert (event["topic"], event["partition"], event["offset"], event["key"]) == (
        "orders",
        2,
        40,
        "aw==",
    )


@pytest.mark.parametrize(
    ("key", "encoded"),
    [
        (None, None),
        (b"", ""),
        (b"\xfb\xff", "+/8="),  # the standard alphabet, padded
        (b"\x00\x01\x02", "AAEC"),
    ],
)
def test_record_event_keys_are_standard_base64_or_null(
    key: bytes | None, encoded: str | None
) -> None:
    acked = produce_acked(
        topic="t",
        partition=0,
        offset=0,
        key=key,
        generation=0,
        count=1,
        producer="s",
        producer_seq=0,
    )
    assert acked["key"] == encoded
    assert delivered_with([], key=key)["key"] == encoded


# Other events ----------------------------------------------------------------------------


def test_committed_has_the_next_offset_to_read() -> None:
    event = committed(group="g", instance="i-1", topic="orders", partition=1, offset=41)
    assert event == {
        "type": "committed",
        "group": "g",
        "instance": "i-1",
        "topic": "orders",
        "partition": 1,
        "offset": 41,
    }


def test_gate_opened_has_the_evidence_it_relied_on() -> None:
    evidence: list[dict[str, Any]] = [
        {"source": 0, "boundary": 10, "committed": 10, "log_start": 0, "mode": "read_only"},
        {"source": 1, "boundary": 7, "committed": None, "log_start": 7, "mode": None},
    ]
    event = gate_opened(
        group="g",
        instance="i-1",
        topic="orders",
        partition=2,
        offset=0,
        generation=3,
        evidence=evidence,
    )
    assert event == {
        "type": "gate_opened",
        "group": "g",
        "instance": "i-1",
        "topic": "orders",
        "partition": 2,
        "offset": 0,
        "generation": 3,
        "evidence": evidence,
    }


def test_gate_opened_keeps_a_copy_of_its_evidence() -> None:
    source = {"source": 0, "boundary": 10}
    event = gate_opened(
        group="g",
        instance="i",
        topic="t",
        partition=0,
        offset=0,
        generation=1,
        evidence=[MappingProxyType(source)],
    )
    source["boundary"] = 99
    # Plain dicts, so that the event serializes; a copy, so that it says what was relied on.
    assert event["evidence"] == [{"source": 0, "boundary": 10}]
    assert type(event["evidence"][0]) is dict
    assert json.loads(json.dumps(event))["evidence"] == [{"source": 0, "boundary": 10}]


def test_gate_opened_without_evidence_has_an_empty_list() -> None:
    event = gate_opened(
        group="g", instance="i", topic="t", partition=0, offset=5, generation=1, evidence=()
    )
    assert event["evidence"] == []


def test_barrier_phase_has_the_change_and_its_coordinator() -> None:
    event = barrier_phase(
        topic="orders",
        kind="expand",
        from_generation=2,
        from_count=4,
        target_count=6,
        phase="barrier",
        coordinator="sidecar-a",
    )
    assert event == {
        "type": "barrier_phase",
        "topic": "orders",
        "kind": "expand",
        "from_generation": 2,
        "from_count": 4,
        "target_count": 6,
        "phase": "barrier",
        "coordinator": "sidecar-a",
    }


def test_admin_has_the_operation_and_its_result() -> None:
    event = admin(topic="orders", kind="shrink", result="done", from_count=6, target_count=4)
    assert event == {
        "type": "admin",
        "topic": "orders",
        "kind": "shrink",
        "result": "done",
        "from_count": 6,
        "target_count": 4,
    }


@pytest.mark.parametrize("log_end", [None, 0, 1234])
def test_boundary_truncated_has_where_the_log_was_cut(log_end: int | None) -> None:
    event = boundary_truncated(
        topic="orders", generation=3, partition=1, boundary=500, leader_epoch=7, log_end=log_end
    )
    assert event == {
        "type": "boundary_truncated",
        "topic": "orders",
        "generation": 3,
        "partition": 1,
        "boundary": 500,
        "leader_epoch": 7,
        "log_end": log_end,
    }


def test_truncation_confirmed_lists_the_confirmed_boundaries() -> None:
    boundaries: list[dict[str, int | None]] = [
        {"generation": 3, "partition": 1, "boundary": 500, "leader_epoch": 7, "log_end": None}
    ]
    event = truncation_confirmed(topic="orders", boundaries=boundaries)
    assert event == {"type": "truncation_confirmed", "topic": "orders", "boundaries": boundaries}


EVERY_EVENT: dict[str, Callable[[], Event]] = {
    "produce_acked": lambda: produce_acked(
        topic="t",
        partition=0,
        offset=1,
        key=b"\xff",
        generation=1,
        count=2,
        producer="s",
        producer_seq=3,
    ),
    "delivered": lambda: delivered_with(sidecar_headers(1, 2, "s", 3)),
    "committed": lambda: committed(group="g", instance="i", topic="t", partition=0, offset=1),
    "gate_opened": lambda: gate_opened(
        group="g",
        instance="i",
        topic="t",
        partition=0,
        offset=1,
        generation=2,
        evidence=[MappingProxyType({"source": 0, "mode": "removed"})],
    ),
    "barrier_phase": lambda: barrier_phase(
        topic="t",
        kind="shrink",
        from_generation=1,
        from_count=2,
        target_count=1,
        phase="done",
        coordinator="s",
    ),
    "admin": lambda: admin(topic="t", kind="create", result="done", from_count=0, target_count=2),
    "boundary_truncated": lambda: boundary_truncated(
        topic="t", generation=1, partition=0, boundary=5, leader_epoch=2, log_end=None
    ),
    "truncation_confirmed": lambda: truncation_confirmed(
        topic="t", boundaries=[{"partition": 0, "log_end": None}]
    ),
}


@pytest.mark.parametrize("name", list(EVERY_EVENT))
def test_every_event_is_json_ready_and_typed_by_its_builder(name: str) -> None:
    event = EVERY_EVENT[name]()
    assert event["type"] == name
    assert json.loads(json.dumps(event, allow_nan=False)) == event


# Common fields ---------------------------------------------------------------------------


def test_stamped_adds_the_common_fields_and_keeps_the_event() -> None:
    event = committed(group="g", instance="i", topic="t", partition=0, offset=3)
    assert stamped(event, sidecar="sidecar-a", seq=0, now=1_700_000_000.25) == {
        "schema": 1,
        "sidecar": "sidecar-a",
        "seq": 0,
        "time": 1_700_000_000.25,
        "type": "committed",
        "group": "g",
        "instance": "i",
        "topic": "t",
        "partition": 0,
        "offset": 3,
    }
    assert SCHEMA_VERSION == 1


@pytest.mark.parametrize("name", list(EVERY_EVENT))
def test_stamped_changes_no_field_of_any_event(name: str) -> None:
    event = EVERY_EVENT[name]()
    before = json.dumps(event)
    result = stamped(event, sidecar="s", seq=7, now=2.5)
    assert {k: v for k, v in result.items() if k not in ("schema", "sidecar", "seq", "time")} == (
        event
    )
    assert (result["schema"], result["sidecar"], result["seq"], result["time"]) == (1, "s", 7, 2.5)
    # A new dict: the argument is left as it was.
    assert result is not event
    assert json.dumps(event) == before
    assert "seq" not in event


def test_stamped_without_a_time_takes_the_wall_clock() -> None:
    before = time.time()
    result = stamped(
        admin(topic="t", kind="adopt", result="done", from_count=1, target_count=1),
        sidecar="s",
        seq=1,
    )
    after = time.time()
    assert isinstance(result["time"], float)
    assert before <= result["time"] <= after


def test_stamped_keeps_a_time_of_zero() -> None:
    result = stamped(
        committed(group="g", instance="i", topic="t", partition=0, offset=0),
        sidecar="s",
        seq=0,
        now=0.0,
    )
    assert result["time"] == 0.0


def test_stamped_events_serialize_as_one_json_object() -> None:
    result = stamped(EVERY_EVENT["delivered"](), sidecar="sidecar-a", seq=12, now=5.0)
    line = json.dumps(result)
    assert "\n" not in line
    assert json.loads(line) == result


# Sampling --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, b"", b"foobar", b"abc"])
def test_a_rate_of_one_or_more_samples_every_key(key: bytes | None) -> None:
    assert key_sampled(key, 1.0)
    assert key_sampled(key, 2.0)


@pytest.mark.parametrize("key", [None, b"", b"foobar", b"abc"])
def test_a_rate_of_zero_samples_no_key(key: bytes | None) -> None:
    assert not key_sampled(key, 0.0)


@pytest.mark.parametrize("rate", [0.0001, 0.5, 0.9999])
def test_records_without_a_key_are_sampled_at_any_positive_rate(rate: float) -> None:
    assert key_sampled(None, rate)


@pytest.mark.parametrize(
    ("key", "bucket"),
    # Kafka's own murmur2 test vectors (UtilsTest): murmur2("foobar") is -790332482,
    # murmur2("abc") 479470107; the bucket is the positive hash modulo 10000.
    [(b"foobar", 1166), (b"abc", 107)],
)
def test_a_key_is_sampled_from_its_kafka_murmur2_bucket(key: bytes, bucket: int) -> None:
    assert not key_sampled(key, bucket / 10_000)
    assert key_sampled(key, (bucket + 1) / 10_000)


def test_the_sampled_share_of_keys_follows_the_rate() -> None:
    keys = [b"key-%d" % i for i in range(10_000)]
    for rate in (0.1, 0.25, 0.5):
        share = sum(key_sampled(key, rate) for key in keys) / len(keys)
        assert rate - 0.02 <= share <= rate + 0.02


@given(
    key=st.binary(max_size=32),
    low=st.floats(min_value=0.0, max_value=1.0),
    high=st.floats(min_value=0.0, max_value=1.0),
)
def test_a_key_sampled_at_a_rate_is_sampled_at_every_higher_rate(
    key: bytes, low: float, high: float
) -> None:
    # So that a sampled key's history is complete wherever the rate is raised, and the
    # same on every sidecar.
    low, high = min(low, high), max(low, high)
    if key_sampled(key, low):
        assert key_sampled(key, high)
    assert key_sampled(key, low) == key_sampled(bytes(key), low)


@pytest.mark.parametrize("rate", [0.57, 0.69, 0.29])
def test_a_rate_covers_exactly_its_share_of_the_buckets(rate: float) -> None:
    # rate * 10_000 is 5699.999... for 0.57: truncated, one bucket would be missing.
    buckets = round(rate * 10_000)
    key = next(
        b"key-%d" % i
        for i in range(100_000)
        if positive_hash(b"key-%d" % i) % 10_000 == buckets - 1
    )
    assert key_sampled(key, rate)
