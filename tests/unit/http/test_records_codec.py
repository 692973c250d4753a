"""The records response of a REST Proxy v2 consumer (``sidecar.http.records_codec``): the
exact JSON of records in each format, which headers are kept (the ``ordered.stamp`` among
them), json records that are not JSON, key hand-off events and rebalance notices, and the
``Accept`` negotiation of ``GET records``."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import InvalidRecord, NotAcceptable
from sidecar.core.placement import (
    STAMP_HEADER,
    HeaderFormat,
    Stamp,
    record_stamp,
    sidecar_headers,
)
from sidecar.core.produce import EmbeddedFormat
from sidecar.http.records_codec import (
    AssignmentNoticeType,
    KeyEvent,
    KeyEventType,
    PartitionRef,
    RebalanceNotice,
    RecordHeaders,
    encode_key_events,
    encode_records_response,
    encode_response,
    key_events_body,
    records_content_type,
    records_media_type,
)


@dataclass(frozen=True, slots=True)
class Record:
    """A consumed record as the encoder reads one (``core.consume.ConsumedRecord``)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


Item = Record | KeyEvent | RebalanceNotice

BINARY = EmbeddedFormat.BINARY
JSON = EmbeddedFormat.JSON
V2 = "application/vnd.kafka.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"
JSON_V2 = "application/vnd.kafka.json.v2+json"
MAX_OFFSET = 2**63 - 1
MAX_PARTITION = 2**31 - 1
NOT_JSON = "read it with a binary consumer, or seek past it"


def encoded(
    items: list[Item], fmt: EmbeddedFormat, kept: RecordHeaders = RecordHeaders.APP
) -> list[dict[str, Any]]:
    entries = json.loads(encode_records_response(items, fmt, kept))
    assert isinstance(entries, list)
    return entries


def one_entry(
    record: Record, fmt: EmbeddedFormat, kept: RecordHeaders = RecordHeaders.APP
) -> dict[str, Any]:
    (entry,) = encoded([record], fmt, kept)
    return entry


def strict_loads(body: bytes) -> object:
    """JSON as a strict parser reads it: NaN and Infinity are not JSON (ValueError)."""

    def refuse(name: str) -> object:
        raise ValueError(f"{name} in a response")

    return json.loads(body, parse_constant=refuse)


# Media types and Accept ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "media_type"), [(BINARY, BINARY_V2), (JSON, JSON_V2)], ids=["binary", "json"]
)
def test_records_media_type_names_the_embedded_format(fmt: EmbeddedFormat, media_type: str) -> None:
    assert records_media_type(fmt) == media_type


@pytest.mark.parametrize("accept", [None, "", "   ", "\t"])
@pytest.mark.parametrize("fmt", list(EmbeddedFormat))
def test_a_missing_or_blank_accept_gets_the_instance_format(
    accept: str | None, fmt: EmbeddedFormat
) -> None:
    assert records_content_type(accept, fmt) == records_media_type(fmt)


@pytest.mark.parametrize(
    "accept",
    [
        "*/*",
        "application/*",
        "application/json",
        "application/json; charset=utf-8",
        V2,
        "APPLICATION/VND.KAFKA.V2+JSON",
        "  application/json ;q=1.0 ",
        "text/html, application/json;q=0.001",
        "*/*;q=1e3",
    ],
)
@pytest.mark.parametrize("fmt", list(EmbeddedFormat))
def test_generic_media_ranges_are_answered_in_the_instance_format(
    accept: str, fmt: EmbeddedFormat
) -> None:
    # REST Proxy would answer these as binary, and fail a json instance.
    assert records_content_type(accept, fmt) == records_media_type(fmt)


@pytest.mark.parametrize(
    "accept",
    [
        f"{JSON_V2};Q=0",
        f"{JSON_V2}; q = 0",
        f"{JSON_V2};q=0.000",
        f"{JSON_V2};q=-1",
        f"{JSON_V2};q=",
        f"{JSON_V2};q=high",
        "*/*;q=0, application/json;q=0",
        f"{JSON_V2};charset=utf-8;q=0",
    ],
)
def test_a_zero_or_unreadable_weight_makes_a_media_range_unacceptable(accept: str) -> None:
    with pytest.raises(NotAcceptable) as caught:
        records_content_type(accept, JSON)
    assert caught.value.message == f"Accept {accept!r} does not include {JSON_V2}"


def test_only_the_first_weight_of_a_media_range_counts() -> None:
    assert records_content_type(f"{JSON_V2};q=0.5;q=0", JSON) == JSON_V2
    with pytest.raises(NotAcceptable):
        records_content_type(f"{JSON_V2};q=0;q=0.5", JSON)


@pytest.mark.parametrize(
    ("accept", "fmt", "asked"),
    [
        (JSON_V2, BINARY, "json"),
        (BINARY_V2, JSON, "binary"),
        ("application/vnd.kafka.avro.v2+json", JSON, "avro"),
        (
            "application/vnd.kafka.protobuf.v2+json, text/plain, "
            "application/vnd.kafka.jsonschema.v2+json",
            BINARY,
            "protobuf or jsonschema",
        ),
    ],
)
def test_another_embedded_format_is_refused_naming_both_formats(
    accept: str, fmt: EmbeddedFormat, asked: str
) -> None:
    with pytest.raises(NotAcceptable) as caught:
        records_content_type(accept, fmt)
    assert caught.value.message == (
        f"Accept asks for {asked} records but this consumer instance was created with format "
        f"{fmt.value}; accept {records_media_type(fmt)}"
    )


def test_not_acceptable_is_rest_proxys_406_40601() -> None:
    with pytest.raises(NotAcceptable) as caught:
        records_content_type("text/html", BINARY)
    assert (caught.value.http_status, caught.value.error_code) == (406, 40601)
    assert caught.value.message == f"Accept 'text/html' does not include {BINARY_V2}"


# Binary records --------------------------------------------------------------------------


def test_binary_record_has_exactly_the_rest_proxy_v2_shape() -> None:
    record = Record("orders", 2, 17, key=b"\xfb\xff", value=b"hello")
    assert encode_records_response([record], BINARY) == (
        b'[{"topic":"orders","key":"+/8=","value":"aGVsbG8=","partition":2,"offset":17}]'
    )


def test_binary_empty_key_and_value_are_empty_strings_not_null() -> None:
    entry = one_entry(Record("t", 0, 0, key=b"", value=b""), BINARY)
    assert (entry["key"], entry["value"]) == ("", "")


def test_binary_tombstone_and_missing_key_are_null() -> None:
    entry = one_entry(Record("t", 0, 0, key=b"k", value=None), BINARY)
    assert (entry["key"], entry["value"]) == ("aw==", None)
    entry = one_entry(Record("t", 0, 1, key=None, value=b"v"), BINARY)
    assert (entry["key"], entry["value"]) == (None, "dg==")


def test_binary_delivers_bytes_that_a_json_consumer_would_refuse() -> None:
    entry = one_entry(Record("t", 0, 0, key=b"not json", value=b"\xff\xfe"), BINARY)
    assert (entry["key"], entry["value"]) == ("bm90IGpzb24=", "//4=")


@pytest.mark.parametrize("fmt", list(EmbeddedFormat))
def test_the_largest_partition_and_offset_are_written_exactly(fmt: EmbeddedFormat) -> None:
    body = encode_records_response([Record("t", MAX_PARTITION, MAX_OFFSET, None, None)], fmt)
    assert body == (
        b'[{"topic":"t","key":null,"value":null,'
        b'"partition":2147483647,"offset":9223372036854775807}]'
    )


@pytest.mark.parametrize("fmt", list(EmbeddedFormat))
def test_no_items_is_an_empty_array(fmt: EmbeddedFormat) -> None:
    assert encode_records_response([], fmt) == b"[]"


def test_topic_and_header_names_are_escaped_as_json_strings() -> None:
    topic = 'a"b\\c\u00e9\x01'
    name = 'h"\u00f1\n'
    record = Record(topic, 0, 0, None, None, headers=((name, b"x"),))
    body = encode_records_response([record], BINARY, RecordHeaders.ALL)
    assert body.isascii()
    assert json.loads(body) == [
        {
            "topic": topic,
            "key": None,
            "value": None,
            "partition": 0,
            "offset": 0,
            "headers": [{"name": name, "value": "eA=="}],
        }
    ]


def test_aiokafka_consumer_records_are_encoded_as_they_come() -> None:
    record = ConsumerRecord(
        topic="orders",
        partition=1,
        offset=5,
        timestamp=1_700_000_000_000,
        timestamp_type=0,
        key=b"k",
        value=b'{"n":1}',
        checksum=None,
        serialized_key_size=1,
        serialized_value_size=7,
        headers=[("trace", b"t")],
    )
    assert encode_records_response([record], BINARY) == (
        b'[{"topic":"orders","key":"aw==","value":"eyJuIjoxfQ==","partition":1,"offset":5,'
        b'"headers":[{"name":"trace","value":"dA=="}]}]'
    )


# Headers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kept", list(RecordHeaders))
@pytest.mark.parametrize("fmt", list(EmbeddedFormat))
def test_a_record_without_headers_has_no_headers_field(
    kept: RecordHeaders, fmt: EmbeddedFormat
) -> None:
    assert encode_records_response([Record("t", 0, 3, None, None)], fmt, kept) == (
        b'[{"topic":"t","key":null,"value":null,"partition":0,"offset":3}]'
    )


def test_the_default_keeps_the_apps_headers_only() -> None:
    record = Record(
        "t", 0, 0, None, None, headers=(("trace", b"1"), *sidecar_headers(3, 4, "s-1", 12))
    )
    body = encode_records_response([record], BINARY)
    assert body == encode_records_response([record], BINARY, RecordHeaders.APP)
    assert json.loads(body)[0]["headers"] == [{"name": "trace", "value": "MQ=="}]


def test_record_headers_none_drops_every_header() -> None:
    record = Record("t", 0, 0, None, None, headers=(("trace", b"1"), (STAMP_HEADER, b"1 2 s 3")))
    assert "headers" not in one_entry(record, BINARY, RecordHeaders.NONE)


def test_headers_are_base64_in_a_json_format_response_too() -> None:
    record = Record("t", 0, 0, b'"k"', b"1", headers=(("h", b'{"a":1}'),))
    entry = one_entry(record, JSON)
    assert entry["headers"] == [{"name": "h", "value": "eyJhIjoxfQ=="}]


def test_null_and_empty_header_values_are_told_apart() -> None:
    record = Record("t", 0, 0, None, None, headers=(("empty", b""), ("null", None)))
    assert one_entry(record, BINARY)["headers"] == [
        {"name": "empty", "value": ""},
        {"name": "null", "value": None},
    ]


def test_headers_keep_their_order_and_repeated_names() -> None:
    headers = (("b", b"1"), ("a", b"2"), ("b", b"3"))
    record = Record("t", 0, 0, None, None, headers=headers)
    entry = one_entry(record, BINARY)
    assert entry["headers"] == [
        {"name": "b", "value": "MQ=="},
        {"name": "a", "value": "Mg=="},
        {"name": "b", "value": "Mw=="},
    ]


@pytest.mark.parametrize("header_format", list(HeaderFormat))
def test_all_headers_expose_the_sidecar_stamp_as_base64_of_its_text(
    header_format: HeaderFormat,
) -> None:
    headers = tuple(sidecar_headers(7, 8, "sidecar-b", 99, header_format))
    entry = one_entry(Record("t", 0, 0, None, b"v", headers=headers), BINARY, RecordHeaders.ALL)
    assert isinstance(entry["headers"], list)
    delivered = [(h["name"], base64.b64decode(h["value"])) for h in entry["headers"]]
    assert delivered == list(headers)
    # What the app gets back is what the sidecar reads a stamp from.
    assert record_stamp(delivered) == Stamp(7, 8, "sidecar-b", 99)


def test_the_stamp_header_has_its_exact_entry() -> None:
    record = Record("t", 0, 0, None, None, headers=((STAMP_HEADER, b"3 4 s-1 12"),))
    assert encode_records_response([record], BINARY, RecordHeaders.ALL) == (
        b'[{"topic":"t","key":null,"value":null,"partition":0,"offset":0,'
        b'"headers":[{"name":"ordered.stamp","value":"MyA0IHMtMSAxMg=="}]}]'
    )


@pytest.mark.parametrize("name", ["ordered.stamp", "ORDERED.STAMP", "Ordered.Sequence", "ordered."])
def test_reserved_names_are_hidden_from_the_app_whatever_their_case(name: str) -> None:
    record = Record("t", 0, 0, None, None, headers=((name, b"x"),))
    assert "headers" not in one_entry(record, BINARY)
    assert one_entry(record, BINARY, RecordHeaders.ALL)["headers"] == [
        {"name": name, "value": "eA=="}
    ]


@pytest.mark.parametrize("name", ["x-ordered.stamp", "ordered", "orderedstamp", " ordered.stamp"])
def test_names_that_only_resemble_the_reserved_prefix_are_the_apps(name: str) -> None:
    record = Record("t", 0, 0, None, None, headers=((name, b"x"),))
    assert one_entry(record, BINARY)["headers"] == [{"name": name, "value": "eA=="}]


def test_each_record_keeps_its_own_values_of_the_repeating_sidecar_headers() -> None:
    # Those entries are cached by name and value: a cache by name alone would repeat the
    # first record's values.
    records: list[Item] = [
        Record("t", 0, offset, None, None, headers=tuple(sidecar_headers(g, c, s, offset, fmt)))
        for offset, (g, c, s, fmt) in enumerate(
            [
                (1, 2, "s-1", HeaderFormat.SEPARATE),
                (2, 3, "s-2", HeaderFormat.SEPARATE),
                (1, 2, "s-1", HeaderFormat.SEPARATE),
                (2, 3, "s-2", HeaderFormat.STAMP),
            ]
        )
    ]
    stamps = []
    for entry in encoded(records, BINARY, RecordHeaders.ALL):
        headers = entry["headers"]
        assert isinstance(headers, list)
        stamps.append(record_stamp([(h["name"], base64.b64decode(h["value"])) for h in headers]))
    assert stamps == [
        Stamp(1, 2, "s-1", 0),
        Stamp(2, 3, "s-2", 1),
        Stamp(1, 2, "s-1", 2),
        Stamp(2, 3, "s-2", 3),
    ]


def test_a_null_repeating_header_is_null() -> None:
    record = Record("t", 0, 0, None, None, headers=(("ordered.generation", None),))
    assert one_entry(record, BINARY, RecordHeaders.ALL)["headers"] == [
        {"name": "ordered.generation", "value": None}
    ]


# JSON records ----------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [(None, None), (b"", b""), (None, b""), (b"", None)])
def test_json_no_bytes_and_empty_bytes_are_both_null(
    key: bytes | None, value: bytes | None
) -> None:
    # As Confluent's KafkaJsonDeserializer reads them; a tombstone is a null value.
    assert encode_records_response([Record("t", 0, 0, key, value)], JSON) == (
        b'[{"topic":"t","key":null,"value":null,"partition":0,"offset":0}]'
    )


def test_json_text_is_embedded_byte_for_byte_but_for_surrounding_whitespace() -> None:
    value = b'\r\n\t {"b": 2,  "a": [1.50, -0e0, 1E+2], "a": "\\u00e9\xc3\xa9"}  \n'
    record = Record("t", 0, 0, key=b" 12345678901234567890123 ", value=value)
    assert encode_records_response([record], JSON) == (
        b'[{"topic":"t","key":12345678901234567890123,'
        b'"value":{"b": 2,  "a": [1.50, -0e0, 1E+2], "a": "\\u00e9\xc3\xa9"},'
        b'"partition":0,"offset":0}]'
    )


@pytest.mark.parametrize(
    "value",
    [b"true", b"false", b"null", b'"s"', b"-0.5e-7", b"[]", b"{}", b'"\\ud83d\\ude00"'],
)
def test_every_kind_of_json_value_is_embedded(value: bytes) -> None:
    body = encode_records_response([Record("t", 0, 0, None, value)], JSON)
    assert body == b'[{"topic":"t","key":null,"value":' + value + b',"partition":0,"offset":0}]'


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'"caf\xe9"', "can't decode byte 0xe9"),  # Latin-1, not UTF-8
        (b'"\xed\xa0\x80"', "can't decode byte 0xed"),  # an encoded surrogate
        (b"\xff\xfe1\x00", "can't decode byte 0xff"),  # UTF-16
        (b'{"n": [1, Infinity]}', "Infinity is not a JSON value"),
        (b"-Infinity", "-Infinity is not a JSON value"),
        (b'"a\x01b"', "Invalid control character"),
        (b'"\\x41"', "Invalid \\escape"),
        (b"[1,]", "Expecting value"),
        (b"01", "Extra data"),
        (b"1 2", "Extra data"),
        (b"\x0c1", "Expecting value"),  # form feed is not JSON whitespace
        (b"{'a': 1}", "Expecting property name enclosed in double quotes"),
    ],
)
def test_json_values_that_are_not_json_fail_the_read_naming_the_record(
    value: bytes, reason: str
) -> None:
    records: list[Item] = [
        Record("orders", 5, 99, None, b"1"),
        Record("orders", 5, 100, None, value),
    ]
    with pytest.raises(InvalidRecord) as caught:
        encode_records_response(records, JSON)
    message = caught.value.message
    assert message.startswith("record orders-5 offset 100: value is not JSON (")
    assert reason in message
    assert message.endswith(f"); {NOT_JSON}")


def test_a_bad_key_is_named_before_a_bad_value() -> None:
    with pytest.raises(InvalidRecord, match=re.escape("record t-0 offset 7: key is not JSON")):
        encode_records_response([Record("t", 0, 7, b"k", b"v")], JSON)


def test_invalid_record_is_a_422_without_the_decoders_exception_attached() -> None:
    with pytest.raises(InvalidRecord) as caught:
        encode_records_response([Record("t", 0, 0, None, b"NaN")], JSON)
    assert (caught.value.http_status, caught.value.error_code) == (422, 42201)
    assert (
        caught.value.message
        == f"record t-0 offset 0: value is not JSON (NaN is not a JSON value); {NOT_JSON}"
    )
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_a_deeply_nested_json_value_is_refused_not_crashed() -> None:
    value = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(InvalidRecord, match=re.escape("value is not JSON (nested too deeply)")):
        encode_records_response([Record("t", 0, 0, None, value)], JSON)


def test_non_ascii_json_text_is_sent_as_utf8() -> None:
    body = encode_records_response([Record("t", 0, 0, None, '"\u00e9\u4e2d"'.encode())], JSON)
    assert '"value":"\u00e9\u4e2d"'.encode() in body
    assert json.loads(body)[0]["value"] == "\u00e9\u4e2d"


# Key hand-off events and rebalance notices ------------------------------------------------


REVOKED = KeyEvent(KeyEventType.KEYS_REVOKED, "t", 1, generation=4, event_id=7)
ASSIGNED = KeyEvent(KeyEventType.KEYS_ASSIGNED, "t", 5, generation=4, event_id=8)
GIVEN = RebalanceNotice(
    AssignmentNoticeType.PARTITIONS_ASSIGNED, (PartitionRef("t", 0), PartitionRef("u", 3))
)


@pytest.mark.parametrize("fmt", list(EmbeddedFormat))
def test_events_and_notices_are_written_in_the_order_given(fmt: EmbeddedFormat) -> None:
    # Putting notices first is the caller's part: the encoder reorders nothing.
    taken = RebalanceNotice(AssignmentNoticeType.PARTITIONS_REVOKED, (PartitionRef("t", 1),))
    items: list[Item] = [GIVEN, REVOKED, Record("t", 1, 9, None, None), ASSIGNED, taken]
    assert encode_records_response(items, fmt) == (
        b'[{"type":"partitions_assigned","partitions":'
        b'[{"topic":"t","partition":0},{"topic":"u","partition":3}]},'
        b'{"type":"keys_revoked","topic":"t","partition":1,"generation":4,"event_id":7},'
        b'{"topic":"t","key":null,"value":null,"partition":1,"offset":9},'
        b'{"type":"keys_assigned","topic":"t","partition":5,"generation":4,"event_id":8},'
        b'{"type":"partitions_revoked","partitions":[{"topic":"t","partition":1}]}]'
    )


def test_a_notice_without_partitions_has_an_empty_list() -> None:
    notice = RebalanceNotice(AssignmentNoticeType.PARTITIONS_REVOKED, ())
    assert encode_records_response([notice], BINARY) == (
        b'[{"type":"partitions_revoked","partitions":[]}]'
    )


def test_key_events_are_the_same_in_a_records_response_and_a_callback_body() -> None:
    events = [REVOKED, KeyEvent(KeyEventType.KEYS_ASSIGNED, "\u00e9", 0, 2**63 - 1, 2**63 - 1)]
    in_records = json.loads(encode_records_response(events, JSON))
    assert in_records == key_events_body(events) == json.loads(encode_key_events(events))
    assert in_records[1] == {
        "type": "keys_assigned",
        "topic": "\u00e9",
        "partition": 0,
        "generation": 9223372036854775807,
        "event_id": 9223372036854775807,
    }


def test_key_events_body_holds_plain_strings_in_field_order() -> None:
    (entry,) = key_events_body([ASSIGNED])
    assert list(entry) == ["type", "topic", "partition", "generation", "event_id"]
    assert type(entry["type"]) is str
    assert entry == {
        "type": "keys_assigned",
        "topic": "t",
        "partition": 5,
        "generation": 4,
        "event_id": 8,
    }


def test_no_key_events_is_an_empty_array() -> None:
    assert key_events_body([]) == []
    assert encode_key_events([]) == b"[]"


def test_a_callback_body_is_compact_utf8() -> None:
    event = KeyEvent(KeyEventType.KEYS_REVOKED, "caf\u00e9", 3, generation=1, event_id=0)
    assert encode_key_events([event, REVOKED]) == (
        b'[{"type":"keys_revoked","topic":"caf\xc3\xa9","partition":3,"generation":1,'
        b'"event_id":0},'
        b'{"type":"keys_revoked","topic":"t","partition":1,"generation":4,"event_id":7}]'
    )


def test_encode_response_is_compact_utf8_json() -> None:
    assert encode_response({"a": "\u00e9", "b": [1, None, True], "c": {}}) == (
        b'{"a":"\xc3\xa9","b":[1,null,true],"c":{}}'
    )


# Properties ------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
json_documents = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
# Text made of JSON's tokens, so that many examples fail close to JSON, and JSON
# documents laid out in the ways json.dumps has.
json_like_text = st.text(alphabet=' \t\r\n[]{}",:0123456789.eE+-truefalsnNIiy\\\x0c', max_size=24)
laid_out_json = st.builds(
    lambda document, indent, ascii_only: json.dumps(
        document, indent=indent, ensure_ascii=ascii_only
    ),
    json_documents,
    st.none() | st.integers(min_value=0, max_value=3),
    st.booleans(),
)


@given(text=json_like_text | laid_out_json)
def test_json_like_text_is_embedded_as_written_or_refused(text: str) -> None:
    data = text.encode()
    try:
        meaning = strict_loads(data) if data else None
    except ValueError:
        with pytest.raises(InvalidRecord, match=r"^record t-0 offset 0: value is not JSON \("):
            encode_records_response([Record("t", 0, 0, None, data)], JSON)
        return
    body = encode_records_response([Record("t", 0, 0, None, data)], JSON)
    embedded = data.strip(b" \t\r\n") if data else b"null"
    assert body == b'[{"topic":"t","key":null,"value":' + embedded + b',"partition":0,"offset":0}]'
    # What is embedded keeps the response valid JSON, and means what was written.
    entries = strict_loads(body)
    assert isinstance(entries, list)
    assert entries[0]["value"] == meaning


@given(document=json_documents)
def test_json_documents_are_never_refused(document: object) -> None:
    data = json.dumps(document, ensure_ascii=False).encode()
    (entry,) = encoded([Record("t", 0, 0, data, data)], JSON)
    assert entry["key"] == entry["value"] == document


records_strategy = st.builds(
    Record,
    topic=st.sampled_from(["t", "orders"]),
    partition=st.integers(min_value=0, max_value=MAX_PARTITION),
    offset=st.integers(min_value=0, max_value=MAX_OFFSET),
    key=st.none() | st.binary(max_size=8),
    value=st.none() | st.binary(max_size=8),
    headers=st.lists(
        st.tuples(
            st.sampled_from(["h", "ordered.stamp", "Ordered.X", "x"]),
            st.none() | st.binary(max_size=4),
        ),
        max_size=3,
    ).map(tuple),
)
events_strategy = st.builds(
    KeyEvent,
    type=st.sampled_from(list(KeyEventType)),
    topic=st.just("t"),
    partition=st.integers(min_value=0, max_value=MAX_PARTITION),
    generation=st.integers(min_value=0, max_value=2**63 - 1),
    event_id=st.integers(min_value=0, max_value=2**63 - 1),
)
notices_strategy = st.builds(
    RebalanceNotice,
    type=st.sampled_from(list(AssignmentNoticeType)),
    partitions=st.lists(
        st.builds(PartitionRef, topic=st.just("t"), partition=st.integers(0, 9)), max_size=3
    ).map(tuple),
)


@given(
    items=st.lists(records_strategy | events_strategy | notices_strategy, max_size=6),
    kept=st.sampled_from(list(RecordHeaders)),
)
def test_any_mix_of_items_gives_one_entry_each_in_order(
    items: list[Item], kept: RecordHeaders
) -> None:
    entries = encoded(items, BINARY, kept)
    assert len(entries) == len(items)

    def decoded(data: object) -> bytes | None:
        return None if data is None else base64.b64decode(str(data), validate=True)

    for item, entry in zip(items, entries, strict=True):
        if isinstance(item, KeyEvent):
            assert entry == key_events_body([item])[0]
        elif isinstance(item, RebalanceNotice):
            assert entry == {
                "type": item.type.value,
                "partitions": [
                    {"topic": p.topic, "partition": p.partition} for p in item.partitions
                ],
            }
        else:
            # Records never have a type: that is how an app tells them from events.
            assert "type" not in entry
            assert (entry["topic"], entry["partition"], entry["offset"]) == (
                item.topic,
                item.partition,
                item.offset,
            )
            assert (decoded(entry["key"]), decoded(entry["value"])) == (item.key, item.value)
            expected = [
                (name, data)
                for name, data in item.headers
                if kept is RecordHeaders.ALL
                or (kept is RecordHeaders.APP and not name.lower().startswith("ordered."))
            ]
            headers = entry.get("headers")
            # Left out, never empty, when no header is kept.
            assert headers is None or (isinstance(headers, list) and headers)
            got = [(h["name"], decoded(h["value"])) for h in headers or []]
            assert got == expected


@pytest.mark.parametrize(
    ("accept", "fmt"),
    [
        (f"{BINARY_V2};q=0, */*", BINARY),
        (f"*/*, {BINARY_V2}; q=0", BINARY),
        (f"{JSON_V2};q=0, application/json", JSON),
    ],
)
def test_the_instances_own_type_refused_by_name_wins_over_a_generic_range(
    accept: str, fmt: EmbeddedFormat
) -> None:
    # RFC 9110 §12.5.1: the most specific range decides.
    with pytest.raises(NotAcceptable) as refused:
        records_content_type(accept, fmt)
    assert refused.value.message == f"Accept {accept!r} does not include {records_media_type(fmt)}"


def test_a_generic_range_refused_does_not_refuse_the_type_named() -> None:
    assert records_content_type(f"*/*;q=0, {BINARY_V2}", BINARY) == BINARY_V2
