"""REST Proxy v2 consumer requests (``sidecar.http.consumer_codec``): every decoder's
shapes and errors."""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import MultiDict

from sidecar.core.consume import TopicPartition
from sidecar.core.errors import BadRequest, InvalidRecord, NotAcceptable, UnsupportedMediaType
from sidecar.core.handoff import TruncationNotice
from sidecar.core.produce import EmbeddedFormat
from sidecar.http.consumer_codec import (
    MAX_EVENT_ID,
    MAX_OFFSET,
    MAX_TOPIC_PATTERN_LENGTH,
    OffsetToCommit,
    RecordsQuery,
    SeekOffset,
    SeekRequest,
    SeekTimestamp,
    SubscribePattern,
    SubscribeTopics,
    decode_assignments,
    decode_commit_offsets,
    decode_committed_request,
    decode_event_ack,
    decode_records_query,
    decode_seek,
    decode_seek_partitions,
    decode_subscription,
)
from sidecar.http.consumer_response_codec import (
    CommittedOffset,
    assignments_body,
    committed_offsets_body,
)
from sidecar.http.create_consumer_codec import decode_create_consumer
from sidecar.http.produce_codec import MAX_PARTITION
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
)
from tests.unit.http.consumer_support import BINARY_V2, JSON_V2, V2, body


@dataclass(frozen=True, slots=True)
class Record:
    """A record to deliver, as the service hands one over (``core.consume.ConsumedRecord``
    is the shape the encoder needs). ``value`` None is a tombstone; ``key`` None is no key."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
topic_names = st.from_regex(r"[a-zA-Z0-9._-]{1,249}", fullmatch=True).filter(
    lambda name: name not in (".", "..")
)
optional_bytes = st.none() | st.binary(max_size=64)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# Request content types -------------------------------------------------------------------

Decoder = Callable[..., object]
BODY_DECODERS: list[tuple[Decoder, object]] = [
    (decode_create_consumer, {}),
    (decode_subscription, {"topics": ["t"]}),
    (decode_assignments, {"partitions": []}),
    (decode_commit_offsets, {"offsets": []}),
    (decode_committed_request, {"partitions": []}),
    (decode_seek, {"offsets": []}),
    (decode_seek_partitions, {"partitions": []}),
    (decode_event_ack, {"event_ids": [1]}),
]


@pytest.mark.parametrize(
    "content_type",
    [
        V2,
        BINARY_V2,
        JSON_V2,
        "application/vnd.kafka.avro.v2+json",
        "application/json",
        "application/json; charset=utf-8",
        'Application/VND.Kafka.V2+JSON; charset="UTF-8"',
    ],
)
@pytest.mark.parametrize(("decode", "document"), BODY_DECODERS)
def test_every_decoder_takes_the_proxy_content_types(
    decode: Decoder, document: object, content_type: str
) -> None:
    decode(body(document), content_type=content_type)


@pytest.mark.parametrize(
    ("content_type", "message"),
    [
        (None, "Content-Type is missing"),
        (" ", "Content-Type is missing"),
        ("text/plain", "content type 'text/plain' is not supported"),
        ("application/x-www-form-urlencoded", "'application/x-www-form-urlencoded'"),
        ("application/vnd.kafka.v1+json", "'application/vnd.kafka.v1+json'"),
        ("application/json; charset=latin-1", "charset 'latin-1' is not supported"),
    ],
)
@pytest.mark.parametrize(("decode", "document"), BODY_DECODERS)
def test_a_body_needs_a_json_content_type(
    decode: Decoder, document: object, content_type: str | None, message: str
) -> None:
    with pytest.raises(UnsupportedMediaType, match=re.escape(message)):
        decode(body(document), content_type=content_type)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "request body is not valid JSON"),
        (b"\xff", "request body is not UTF-8"),
        (b"[]", "request body must be a JSON object, got array"),
        (b'"x"', "request body must be a JSON object, got string"),
        (b'{"a": NaN}', "NaN is not a JSON value"),
    ],
)
@pytest.mark.parametrize(("decode", "document"), BODY_DECODERS)
def test_a_body_must_be_a_json_object(
    decode: Decoder, document: object, raw: bytes, message: str
) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode(raw, content_type=V2)


@pytest.mark.parametrize(
    "decode",
    [
        decode_subscription,
        decode_assignments,
        decode_committed_request,
        decode_seek,
        decode_seek_partitions,
        decode_event_ack,
    ],
)
@pytest.mark.parametrize(("raw", "content_type"), [(b"", None), (b"  ", V2), (b"null", V2)])
def test_routes_that_need_a_body_refuse_none(
    decode: Decoder, raw: bytes, content_type: str | None
) -> None:
    with pytest.raises(BadRequest, match="request body is missing"):
        decode(raw, content_type=content_type)


# Subscription and assignment -------------------------------------------------------------


def test_subscribe_to_topics_and_to_a_pattern() -> None:
    topics = decode_subscription(body({"topics": ["orders", "a.b_c-9"]}), content_type=V2)
    assert topics == SubscribeTopics(("orders", "a.b_c-9"))
    pattern = decode_subscription(body({"topic_pattern": "orders-.*"}), content_type=V2)
    assert pattern == SubscribePattern("orders-.*")
    with_null = decode_subscription(body({"topics": None, "topic_pattern": "x"}), content_type=V2)
    assert with_null == SubscribePattern("x")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "send exactly one of topics and topic_pattern"),
        ({"topics": ["a"], "topic_pattern": "a"}, "send exactly one of topics and topic_pattern"),
        ({"topics": None, "topic_pattern": None}, "send exactly one"),
        ({"topics": []}, "topics is empty; DELETE the subscription to unsubscribe"),
        ({"topics": "orders"}, "topics must be an array, got string"),
        ({"topics": ["ok", 5]}, "topics[1] must be a string, got number"),
        ({"topics": ["ok", None]}, "topics[1] is missing"),
        ({"topics": [""]}, "topics[0] '' is not a topic name"),
        ({"topics": ["."]}, "topics[0] '.' is not a topic name"),
        ({"topics": [".."]}, "topics[0] '..' is not a topic name"),
        ({"topics": ["a b"]}, "topics[0] 'a b' is not a topic name"),
        ({"topics": ["naïve"]}, "topics[0] 'naïve' is not a topic name"),
        ({"topics": ["t" * 250]}, "is not a topic name: use 1 to 249 of A-Z a-z 0-9 . _ -"),
        ({"topics": ["a", "b", "a"]}, "topics names 'a' twice (entries 0 and 2)"),
        ({"topic_pattern": "(orders"}, "topic_pattern '(orders' is not a valid regular expression"),
        ({"topic_pattern": "*"}, "is not a valid regular expression"),
        ({"topic_pattern": ""}, "topic_pattern must be 1 to 1024 characters, got 0"),
        ({"topic_pattern": "a" * (MAX_TOPIC_PATTERN_LENGTH + 1)}, "got 1025"),
        ({"topic_pattern": ["a"]}, "topic_pattern must be a string, got array"),
        ({"topic": "orders"}, "unknown field(s) ['topic']"),
    ],
)
def test_invalid_subscriptions(document: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode_subscription(body(document), content_type=V2)


def test_longest_topic_name_is_accepted() -> None:
    name = "t" * 249
    assert decode_subscription(body({"topics": [name]}), content_type=V2) == SubscribeTopics(
        (name,)
    )


def test_assign_partitions_and_answer_them() -> None:
    partitions = decode_assignments(
        body({"partitions": [{"topic": "a", "partition": 0}, {"topic": "a", "partition": 7}]}),
        content_type=V2,
    )
    assert partitions == (PartitionRef("a", 0), PartitionRef("a", 7))
    assert encode_response(assignments_body(partitions)) == (
        b'{"partitions":[{"topic":"a","partition":0},{"topic":"a","partition":7}]}'
    )


def test_assigning_no_partitions_is_allowed() -> None:
    assert decode_assignments(body({"partitions": []}), content_type=V2) == ()


PARTITION_LIST_ERRORS = [
    ({}, "partitions is missing"),
    ({"partitions": None}, "partitions is missing"),
    ({"partitions": {}}, "partitions must be an array, got object"),
    ({"partitions": [3]}, "partitions[0] must be a JSON object, got number"),
    ({"partitions": [{"partition": 0}]}, "partitions[0].topic is missing"),
    ({"partitions": [{"topic": "a"}]}, "partitions[0].partition is missing"),
    ({"partitions": [{"topic": "a", "partition": -1}]}, "partitions[0].partition must be"),
    ({"partitions": [{"topic": "a", "partition": 2**31}]}, f"from 0 to {MAX_PARTITION}"),
    ({"partitions": [{"topic": "a", "partition": "1"}]}, "partitions[0].partition must be"),
    ({"partitions": [{"topic": "a", "partition": True}]}, "partitions[0].partition must be"),
    ({"partitions": [{"topic": "a", "partition": 1.0}]}, "partitions[0].partition must be"),
    ({"partitions": [{"topic": "a/b", "partition": 1}]}, "partitions[0].topic 'a/b' is not"),
    (
        {"partitions": [{"topic": "a", "partition": 1, "offset": 3}]},
        "partitions[0] has unknown field(s) ['offset']",
    ),
    (
        {"partitions": [{"topic": "a", "partition": 1}, {"topic": "a", "partition": 1}]},
        "partitions names a-1 twice (entries 0 and 1)",
    ),
    ({"partition": []}, "unknown field(s) ['partition']"),
]


@pytest.mark.parametrize(
    "decode", [decode_assignments, decode_committed_request, decode_seek_partitions]
)
@pytest.mark.parametrize(("document", "message"), PARTITION_LIST_ERRORS)
def test_invalid_partition_lists(decode: Decoder, document: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode(body(document), content_type=V2)


# Records query ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({}, RecordsQuery(timeout_ms=5000, max_bytes=1_000_000)),
        ({"timeout": "1000"}, RecordsQuery(timeout_ms=1000, max_bytes=1_000_000)),
        ({"timeout": "-1", "max_bytes": "-1"}, RecordsQuery(5000, 1_000_000)),
        ({"timeout": "0", "max_bytes": "0"}, RecordsQuery(5000, 1_000_000)),
        ({"timeout": "60000"}, RecordsQuery(5000, 1_000_000)),
        ({"max_bytes": "300"}, RecordsQuery(5000, 300)),
        ({"max_bytes": "99999999"}, RecordsQuery(5000, 1_000_000)),
        ({"timeout": " 7 "}, RecordsQuery(7, 1_000_000)),
        ({"timeout": "9223372036854775807"}, RecordsQuery(5000, 1_000_000)),
        ({"timeout": "-9223372036854775808"}, RecordsQuery(5000, 1_000_000)),
        ({"format": "binary", "_": "1700000000"}, RecordsQuery(5000, 1_000_000)),
    ],
)
def test_records_query_follows_rest_proxy(query: dict[str, str], expected: RecordsQuery) -> None:
    assert decode_records_query(query, default_timeout_ms=5000, max_bytes_limit=1_000_000) == (
        expected
    )


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"timeout": "abc"}, "query parameter timeout must be a decimal integer (milliseconds)"),
        ({"timeout": ""}, "timeout must be a decimal integer (milliseconds), got ''"),
        ({"timeout": "1.5"}, "got '1.5'"),
        ({"timeout": "+5"}, "got '+5'"),
        ({"timeout": "1_000"}, "got '1_000'"),
        ({"timeout": "٣"}, "got '٣'"),
        ({"timeout": "9223372036854775808"}, "got '9223372036854775808'"),
        ({"max_bytes": "1k"}, "query parameter max_bytes must be a decimal integer, got '1k'"),
    ],
)
def test_invalid_records_query(query: dict[str, str], message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode_records_query(query, default_timeout_ms=5000, max_bytes_limit=1_000_000)


def test_a_query_parameter_repeated_must_repeat_its_value() -> None:
    same = MultiDict([("timeout", "10"), ("timeout", "10")])
    assert decode_records_query(same, default_timeout_ms=50, max_bytes_limit=5).timeout_ms == 10
    different = MultiDict([("timeout", "10"), ("timeout", "20")])
    with pytest.raises(BadRequest, match="timeout is sent more than once with different values"):
        decode_records_query(different, default_timeout_ms=50, max_bytes_limit=5)


# Records content negotiation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "fmt"),
    [
        (None, EmbeddedFormat.BINARY),
        ("", EmbeddedFormat.JSON),
        (BINARY_V2, EmbeddedFormat.BINARY),
        (JSON_V2, EmbeddedFormat.JSON),
        ("Application/VND.Kafka.JSON.v2+JSON", EmbeddedFormat.JSON),
        (V2, EmbeddedFormat.JSON),
        ("application/json", EmbeddedFormat.JSON),
        ("*/*", EmbeddedFormat.JSON),
        ("application/*;q=0.1", EmbeddedFormat.BINARY),
        (f"{BINARY_V2}, {JSON_V2};q=0.9", EmbeddedFormat.JSON),
        (f"text/html, {JSON_V2}; q=0.5", EmbeddedFormat.JSON),
    ],
)
def test_accept_that_fits_the_instance_gets_its_format(
    accept: str | None, fmt: EmbeddedFormat
) -> None:
    assert records_content_type(accept, fmt) == f"application/vnd.kafka.{fmt.value}.v2+json"


@pytest.mark.parametrize(
    ("accept", "fmt", "message"),
    [
        (
            JSON_V2,
            EmbeddedFormat.BINARY,
            "Accept asks for json records but this consumer instance was created with format "
            f"binary; accept {BINARY_V2}",
        ),
        (
            f"{BINARY_V2}, application/vnd.kafka.avro.v2+json",
            EmbeddedFormat.JSON,
            "Accept asks for binary or avro records",
        ),
        ("text/html", EmbeddedFormat.JSON, f"Accept 'text/html' does not include {JSON_V2}"),
        (f"{JSON_V2};q=0", EmbeddedFormat.JSON, "does not include"),
        (f"{JSON_V2};q=0.0, */*;q=0", EmbeddedFormat.JSON, "does not include"),
        (f"{JSON_V2};q=abc", EmbeddedFormat.JSON, "does not include"),
        (f"{JSON_V2};q=nan", EmbeddedFormat.JSON, "does not include"),
        (", ;", EmbeddedFormat.JSON, "does not include"),
    ],
)
def test_accept_that_does_not_fit_is_refused(
    accept: str, fmt: EmbeddedFormat, message: str
) -> None:
    with pytest.raises(NotAcceptable, match=re.escape(message)):
        records_content_type(accept, fmt)


# Records response ------------------------------------------------------------------------


def test_binary_records_are_base64_and_rest_proxy_shaped() -> None:
    records = [
        Record("orders", 3, 41, key=b"\x00k", value=b"\xffv"),
        Record("orders", 3, 42, key=None, value=None),
        Record("orders", 4, 0, key=b"", value=b"", headers=(("h", b"x"), ("n", None))),
    ]
    assert encode_records_response(records, EmbeddedFormat.BINARY) == (
        b'[{"topic":"orders","key":"AGs=","value":"/3Y=","partition":3,"offset":41},'
        b'{"topic":"orders","key":null,"value":null,"partition":3,"offset":42},'
        b'{"topic":"orders","key":"","value":"","partition":4,"offset":0,'
        b'"headers":[{"name":"h","value":"eA=="},{"name":"n","value":null}]}]'
    )


MANAGED_RECORD = Record(
    "orders",
    1,
    7,
    key=b"k",
    value=b"v",
    headers=(
        ("trace", b"t1"),
        ("ordered.generation", b"3"),
        ("ordered.count", b"4"),
        ("ordered.sidecar", b"s-1"),
        ("ordered.sequence", b"12"),
    ),
)


@pytest.mark.parametrize(
    ("kept", "names"),
    [
        (
            RecordHeaders.ALL,
            [
                "trace",
                "ordered.generation",
                "ordered.count",
                "ordered.sidecar",
                "ordered.sequence",
            ],
        ),
        (RecordHeaders.APP, ["trace"]),
        (RecordHeaders.NONE, None),
    ],
)
def test_record_headers_keeps_the_headers_asked_for(
    kept: RecordHeaders, names: list[str] | None
) -> None:
    (entry,) = json.loads(encode_records_response([MANAGED_RECORD], EmbeddedFormat.BINARY, kept))
    kept_names = [h["name"] for h in entry["headers"]] if "headers" in entry else None
    assert kept_names == names
    assert (entry["key"], entry["value"]) == ("aw==", "dg==")


def test_a_record_with_only_sidecar_headers_has_the_plain_shape_for_app() -> None:
    record = Record("orders", 0, 1, key=None, value=b"", headers=(("Ordered.Generation", b"1"),))
    assert encode_records_response([record], EmbeddedFormat.BINARY, RecordHeaders.APP) == (
        b'[{"topic":"orders","key":null,"value":"","partition":0,"offset":1}]'
    )


def test_json_records_embed_the_json_text_as_it_is() -> None:
    records = [
        Record("t", 0, 1, key=b'"user-1"', value=b' {"n": 1e400, "big": 1' + b"0" * 5000 + b"}\n"),
        Record("t", 0, 2, key=None, value=None),
        Record("t", 0, 3, key=b"", value='["é", "\\ud800"]'.encode()),
    ]
    encoded = encode_records_response(records, EmbeddedFormat.JSON)
    assert encoded == (
        b'[{"topic":"t","key":"user-1","value":{"n": 1e400, "big": 1'
        + b"0" * 5000
        + b'},"partition":0,"offset":1},'
        b'{"topic":"t","key":null,"value":null,"partition":0,"offset":2},'
        b'{"topic":"t","key":null,"value":["\xc3\xa9", "\\ud800"],"partition":0,"offset":3}]'
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"plain text", "Expecting value"),
        (b"{", "Expecting property name"),
        (b"\xff", "can't decode byte 0xff"),
        (b"\xef\xbb\xbf{}", "BOM"),
        (b"NaN", "NaN is not a JSON value"),
        (b"[-Infinity]", "-Infinity is not a JSON value"),
        (b" ", "Expecting value"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_json_records_that_are_not_json_are_refused_by_name(value: bytes, reason: str) -> None:
    records = [Record("t", 0, 0, None, b"1"), Record("orders", 3, 41, None, value)]
    with pytest.raises(
        InvalidRecord, match=re.escape("record orders-3 offset 41: value is not JSON (")
    ) as caught:
        encode_records_response(records, EmbeddedFormat.JSON)
    assert reason in caught.value.message
    assert "read it with a binary consumer, or seek past it" in caught.value.message


def test_a_key_that_is_not_json_names_the_key() -> None:
    record = Record("t", 1, 2, key=b"k", value=b"{}")
    with pytest.raises(InvalidRecord, match="record t-1 offset 2: key is not JSON"):
        encode_records_response([record], EmbeddedFormat.JSON)


def test_key_events_sit_among_records_in_order() -> None:
    items: list[Record | KeyEvent] = [
        Record("t", 1, 9, key=None, value=b"1"),
        KeyEvent(KeyEventType.KEYS_REVOKED, "t", 1, generation=4, event_id=7),
        KeyEvent(KeyEventType.KEYS_ASSIGNED, "t", 5, generation=4, event_id=8),
    ]
    assert json.loads(encode_records_response(items, EmbeddedFormat.JSON)) == [
        {"topic": "t", "key": None, "value": 1, "partition": 1, "offset": 9},
        {
            "type": "keys_revoked",
            "topic": "t",
            "partition": 1,
            "generation": 4,
            "event_id": 7,
        },
        {
            "type": "keys_assigned",
            "topic": "t",
            "partition": 5,
            "generation": 4,
            "event_id": 8,
        },
    ]


def test_assignment_notices_have_no_event_id() -> None:
    items: list[Record | KeyEvent | RebalanceNotice] = [
        RebalanceNotice(
            AssignmentNoticeType.PARTITIONS_ASSIGNED, (PartitionRef("t", 0), PartitionRef("t", 2))
        ),
        Record("t", 2, 0, key=None, value=b"1"),
        RebalanceNotice(AssignmentNoticeType.PARTITIONS_REVOKED, (PartitionRef("t", 2),)),
    ]
    assert json.loads(encode_records_response(items, EmbeddedFormat.JSON)) == [
        {
            "type": "partitions_assigned",
            "partitions": [{"topic": "t", "partition": 0}, {"topic": "t", "partition": 2}],
        },
        {"topic": "t", "key": None, "value": 1, "partition": 2, "offset": 0},
        {"type": "partitions_revoked", "partitions": [{"topic": "t", "partition": 2}]},
    ]


def test_a_truncation_notice_says_where_reading_resumes_and_what_was_lost() -> None:
    items: list[Record | KeyEvent | RebalanceNotice | TruncationNotice] = [
        TruncationNotice(TopicPartition("t", 1), 10, 1, 7, 3),
        Record("t", 1, 7, key=None, value=b"1"),
        TruncationNotice(TopicPartition("t", 2), 4, 0, None, 0),
    ]
    assert json.loads(encode_records_response(items, EmbeddedFormat.JSON)) == [
        {
            "type": "log_truncated",
            "topic": "t",
            "partition": 1,
            "offset": 7,
            "position": 10,
            "leader_epoch": 1,
            "lost": 3,
        },
        {"topic": "t", "key": None, "value": 1, "partition": 1, "offset": 7},
        {
            "type": "log_truncated",
            "topic": "t",
            "partition": 2,
            "offset": None,
            "position": 4,
            "leader_epoch": 0,
            "lost": 0,
        },
    ]


@pytest.mark.parametrize("fmt", list(EmbeddedFormat))
def test_no_records_is_an_empty_array(fmt: EmbeddedFormat) -> None:
    assert encode_records_response([], fmt) == b"[]"


# Offsets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "content_type"),
    [(b"", None), (b"", V2), (b"null", V2), (b"{}", V2), (b'{"offsets": null}', V2)],
)
def test_commit_without_offsets_commits_everything_delivered(
    raw: bytes, content_type: str | None
) -> None:
    assert decode_commit_offsets(raw, content_type=content_type) is None


def test_commit_of_an_empty_list_commits_nothing() -> None:
    assert decode_commit_offsets(body({"offsets": []}), content_type=V2) == ()


def test_commit_names_the_last_processed_offset_and_kafka_stores_the_next() -> None:
    offsets = decode_commit_offsets(
        body(
            {
                "offsets": [
                    {"topic": "a", "partition": 0, "offset": 41},
                    {"topic": "a", "partition": 1, "offset": 0, "metadata": "batch-7"},
                ]
            }
        ),
        content_type=V2,
    )
    assert offsets == (
        OffsetToCommit("a", 0, 41, None),
        OffsetToCommit("a", 1, 0, "batch-7"),
    )
    assert [entry.next_offset for entry in offsets] == [42, 1]


def test_largest_committable_offset() -> None:
    document = {"offsets": [{"topic": "a", "partition": 0, "offset": MAX_OFFSET - 1}]}
    (offset,) = decode_commit_offsets(body(document), content_type=V2) or ()
    assert offset.next_offset == MAX_OFFSET


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"topic": "a", "partition": 0}, "offsets[0].offset is missing"),
        ({"topic": "a", "partition": 0, "offset": -1}, "offsets[0].offset must be an integer"),
        ({"topic": "a", "partition": 0, "offset": MAX_OFFSET}, f"to {MAX_OFFSET - 1}, got"),
        ({"topic": "a", "partition": 0, "offset": "5"}, "offsets[0].offset must be an integer"),
        ({"topic": "a", "partition": 0, "offset": 5.0}, "offsets[0].offset must be an integer"),
        ({"topic": "a", "partition": -1, "offset": 5}, "offsets[0].partition must be"),
        ({"partition": 0, "offset": 5}, "offsets[0].topic is missing"),
        ({"topic": "a", "partition": 0, "offset": 1, "metadata": 3}, "metadata must be a string"),
        ({"topic": "a", "partition": 0, "offset": 1, "generation": 3}, "['generation']"),
        ("a-0", "offsets[0] must be a JSON object, got string"),
    ],
)
def test_invalid_commits(entry: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode_commit_offsets(body({"offsets": [entry]}), content_type=V2)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"offsets": {}}, "offsets must be an array, got object"),
        ({"offset": []}, "unknown field(s) ['offset']"),
        (
            {
                "offsets": [
                    {"topic": "a", "partition": 0, "offset": 1},
                    {"topic": "a", "partition": 0, "offset": 2},
                ]
            },
            "offsets names a-0 twice (entries 0 and 1)",
        ),
    ],
)
def test_invalid_commit_documents(document: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode_commit_offsets(body(document), content_type=V2)


def test_committed_offsets_request_and_response() -> None:
    request = decode_committed_request(
        body({"partitions": [{"topic": "a", "partition": 2}]}), content_type=V2
    )
    assert request == (PartitionRef("a", 2),)
    response = committed_offsets_body([CommittedOffset("a", 2, 42, "")])
    assert encode_response(response) == (
        b'{"offsets":[{"topic":"a","partition":2,"offset":42,"metadata":""}]}'
    )


# Positions -------------------------------------------------------------------------------


def test_seek_to_offsets_drops_metadata() -> None:
    request = decode_seek(
        body(
            {
                "offsets": [
                    {"topic": "a", "partition": 0, "offset": 0},
                    {"topic": "a", "partition": 1, "offset": MAX_OFFSET, "metadata": "m"},
                ]
            }
        ),
        content_type=V2,
    )
    assert request == SeekRequest(
        offsets=(SeekOffset("a", 0, 0), SeekOffset("a", 1, MAX_OFFSET)), timestamps=()
    )


@pytest.mark.parametrize(
    ("timestamp", "expected_ms"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("2024-01-02T03:04:05.678Z", 1_704_164_645_678),
        ("2024-01-02T05:04:05.678+02:00", 1_704_164_645_678),
        ("2024-01-02T03:04:05.678999+00:00", 1_704_164_645_678),
    ],
)
def test_seek_to_timestamps(timestamp: str, expected_ms: int) -> None:
    request = decode_seek(
        body({"timestamps": [{"topic": "a", "partition": 0, "timestamp": timestamp}]}),
        content_type=V2,
    )
    assert request == SeekRequest(offsets=(), timestamps=(SeekTimestamp("a", 0, expected_ms),))


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "offsets is missing"),
        ({"offsets": None, "timestamps": None}, "offsets is missing"),
        ({"offsets": [{"topic": "a", "partition": 0}]}, "offsets[0].offset is missing"),
        ({"offsets": [{"topic": "a", "partition": 0, "offset": -1}]}, "offsets[0].offset must"),
        ({"offsets": [{"topic": "a", "partition": 0, "offset": 2**63}]}, "offsets[0].offset"),
        ({"timestamps": {}}, "timestamps must be an array, got object"),
        (
            {"timestamps": [{"topic": "a", "partition": 0, "timestamp": "2024-01-02T03:04:05"}]},
            "timestamps[0].timestamp must be an ISO-8601 date-time with a time zone",
        ),
        (
            {"timestamps": [{"topic": "a", "partition": 0, "timestamp": "1969-12-31T23:59:59Z"}]},
            "from 1970, got '1969-12-31T23:59:59Z'",
        ),
        (
            {"timestamps": [{"topic": "a", "partition": 0, "timestamp": 1_700_000_000}]},
            "timestamps[0].timestamp must be an ISO-8601 date-time",
        ),
        (
            {"timestamps": [{"topic": "a", "partition": 0, "timestamp": "yesterday"}]},
            "got 'yesterday'",
        ),
        (
            {"timestamps": [{"topic": "a", "partition": 0, "offset": 1}]},
            "timestamps[0] has unknown field(s) ['offset']",
        ),
        (
            {
                "offsets": [{"topic": "a", "partition": 0, "offset": 1}],
                "timestamps": [{"topic": "a", "partition": 0, "timestamp": "2024-01-01T00:00Z"}],
            },
            "offsets and timestamps names a-0 twice (entries 0 and 1)",
        ),
        ({"partitions": []}, "unknown field(s) ['partitions']"),
    ],
)
def test_invalid_seeks(document: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode_seek(body(document), content_type=V2)


def test_seek_to_beginning_or_end() -> None:
    partitions = decode_seek_partitions(
        body({"partitions": [{"topic": "a", "partition": 0}, {"topic": "b", "partition": 0}]}),
        content_type=V2,
    )
    assert partitions == (PartitionRef("a", 0), PartitionRef("b", 0))


# Key hand-off events ---------------------------------------------------------------------


def test_key_events_encode_as_a_list() -> None:
    events = [KeyEvent(KeyEventType.KEYS_ASSIGNED, "t", 5, generation=2, event_id=1)]
    assert key_events_body(events) == [
        {"type": "keys_assigned", "topic": "t", "partition": 5, "generation": 2, "event_id": 1}
    ]
    assert encode_key_events(events) == (
        b'[{"type":"keys_assigned","topic":"t","partition":5,"generation":2,"event_id":1}]'
    )


def test_event_ack_lists_the_finished_events() -> None:
    ack = decode_event_ack(body({"event_ids": [3, 0, MAX_EVENT_ID]}), content_type=V2)
    assert ack == (3, 0, MAX_EVENT_ID)
    assert decode_event_ack(body({"event_ids": []}), content_type=V2) == ()


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "event_ids is missing"),
        ({"event_ids": 1}, "event_ids must be an array, got number"),
        ({"event_ids": [1, -1]}, f"event_ids[1] must be an integer from 0 to {MAX_EVENT_ID}"),
        ({"event_ids": ["1"]}, "event_ids[0] must be an integer from 0 to"),
        ({"event_ids": [1.0]}, "event_ids[0] must be an integer from 0 to"),
        ({"event_ids": [True]}, "event_ids[0] must be an integer from 0 to"),
        ({"event_ids": [None]}, "event_ids[0] must be an integer from 0 to"),
        ({"event_ids": [MAX_EVENT_ID + 1]}, "event_ids[0] must be an integer from 0 to"),
        ({"event_ids": [4, 5, 4]}, "event_ids names 4 twice (entries 0 and 2)"),
        ({"event_ids": [], "generation": 3}, "unknown field(s) ['generation']"),
    ],
)
def test_invalid_event_acks(document: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode_event_ack(body(document), content_type=V2)


# Properties ------------------------------------------------------------------------------


@given(
    key=optional_bytes,
    value=optional_bytes,
    partition=st.integers(min_value=0, max_value=MAX_PARTITION),
    offset=st.integers(min_value=0, max_value=MAX_OFFSET),
    headers=st.lists(st.tuples(st.text(), optional_bytes), max_size=4),
)
def test_any_bytes_survive_the_binary_records_encoding(
    key: bytes | None,
    value: bytes | None,
    partition: int,
    offset: int,
    headers: list[tuple[str, bytes | None]],
) -> None:
    def decoded(data: str | None) -> bytes | None:
        return None if data is None else base64.b64decode(data, validate=True)

    record = Record("t", partition, offset, key, value, tuple(headers))
    # Every header, the reserved ``ordered.*`` names too (the default keeps the app's).
    encoded = encode_records_response([record], EmbeddedFormat.BINARY, RecordHeaders.ALL)
    (entry,) = json.loads(encoded)
    assert (decoded(entry["key"]), decoded(entry["value"])) == (key, value)
    assert (entry["topic"], entry["partition"], entry["offset"]) == ("t", partition, offset)
    assert [(h["name"], decoded(h["value"])) for h in entry.get("headers", [])] == headers


@given(key=json_values, value=json_values)
def test_any_json_value_survives_the_json_records_encoding(key: object, value: object) -> None:
    def stored(document: object) -> bytes:
        return json.dumps(document, ensure_ascii=False).encode("utf-8")

    record = Record("t", 0, 0, stored(key), stored(value))
    (entry,) = json.loads(encode_records_response([record], EmbeddedFormat.JSON))
    assert (entry["key"], entry["value"]) == (key, value)


@given(topics=st.lists(topic_names, min_size=1, max_size=5, unique=True))
def test_any_kafka_topic_names_subscribe(topics: list[str]) -> None:
    decoded = decode_subscription(body({"topics": topics}), content_type=V2)
    assert decoded == SubscribeTopics(tuple(topics))


@given(
    entries=st.lists(
        st.tuples(
            topic_names,
            st.integers(min_value=0, max_value=MAX_PARTITION),
            st.integers(min_value=0, max_value=MAX_OFFSET - 1),
            st.none() | st.text(),
        ),
        max_size=4,
        unique_by=lambda entry: (entry[0], entry[1]),
    )
)
def test_any_valid_commit_round_trips(entries: list[tuple[str, int, int, str | None]]) -> None:
    document = {
        "offsets": [
            {"topic": t, "partition": p, "offset": o, "metadata": m} for t, p, o, m in entries
        ]
    }
    decoded = decode_commit_offsets(body(document), content_type=V2)
    assert decoded == tuple(OffsetToCommit(t, p, o, m) for t, p, o, m in entries)


ALL_DECODERS: list[Decoder] = [decoder for decoder, _ in BODY_DECODERS]


@given(
    document=json_values
    | st.dictionaries(
        st.sampled_from(
            [
                "name",
                "format",
                "callback_url",
                "topics",
                "topic_pattern",
                "partitions",
                "offsets",
                "timestamps",
                "event_ids",
            ]
        ),
        json_values | st.lists(json_values | st.dictionaries(st.text(), json_values)),
    ),
    decode=st.sampled_from(ALL_DECODERS),
)
def test_any_json_document_decodes_or_is_refused_as_a_bad_request(
    document: object, decode: Decoder
) -> None:
    # Anything else escaping (TypeError, KeyError, RecursionError, ...) fails the test.
    with contextlib.suppress(BadRequest):
        decode(body(document), content_type=V2)


@given(raw=st.binary(max_size=128), decode=st.sampled_from(ALL_DECODERS))
def test_any_body_bytes_decode_or_are_refused_as_sidecar_errors(
    raw: bytes, decode: Decoder
) -> None:
    with contextlib.suppress(BadRequest, UnsupportedMediaType):
        decode(raw, content_type=None)


@given(accept=st.text(max_size=64), fmt=st.sampled_from(list(EmbeddedFormat)))
def test_any_accept_header_negotiates_or_is_refused(accept: str, fmt: EmbeddedFormat) -> None:
    with contextlib.suppress(NotAcceptable):
        assert records_content_type(accept, fmt).endswith(f".{fmt.value}.v2+json")
