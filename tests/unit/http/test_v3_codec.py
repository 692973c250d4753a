"""REST Proxy v3 records: decoding, stream framing and answers (``http.v3_codec``)."""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import (
    BadRequest,
    FencedGeneration,
    InvalidRecord,
    PayloadTooLarge,
    SidecarError,
    UnsupportedMediaType,
)
from sidecar.core.produce import RecordFailed, RecordWritten
from sidecar.http import v3_codec

LIMIT = 1 << 20


def decode(document: Any) -> v3_codec.V3Record:
    return v3_codec.decode_record(json.dumps(document).encode(), max_record_bytes=LIMIT)


def test_each_type_is_written_as_rest_proxy_writes_it() -> None:
    decoded = decode(
        {
            "partition_id": 2,
            "key": {"type": "STRING", "data": "ключ"},
            "value": {"type": "JSON", "data": {"a": [1, "x"]}},
            "headers": [{"name": "h", "value": base64.b64encode(b"\x00").decode()}],
            "timestamp": "2026-11-23T12:00:00.250+01:00",
        }
    )
    record = decoded.record
    assert record.key == "ключ".encode()
    assert record.value == b'{"a":[1,"x"]}'
    assert record.partition == 2
    assert record.headers == (("h", b"\x00"),)
    assert record.timestamp_ms == 1795431600250
    assert (decoded.key_type, decoded.value_type) == ("STRING", "JSON")


def test_binary_is_the_default_and_null_data_is_no_key_or_a_tombstone() -> None:
    decoded = decode({"key": {"data": base64.b64encode(b"k").decode()}, "value": {"data": None}})
    assert decoded.record.key == b"k"
    assert decoded.record.value is None
    assert (decoded.key_type, decoded.value_type) == ("BINARY", "BINARY")
    bare = decode({})
    assert (bare.record.key, bare.record.value, bare.key_type, bare.value_type) == (
        None,
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    "data", [{"type": "AVRO", "data": 1}, {"schema_id": 3, "data": 1}, {"subject": "s"}]
)
def test_schemas_are_refused_as_not_supported(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidRecord, match="schema registry"):
        decode({"value": data})


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ({"records": []}, "unknown field"),
        ({"key": {"type": "STRING", "data": 5}}, "key.data"),
        ({"key": {"type": "BINARY", "data": "not base64!"}}, "base64"),
        ({"key": {"type": "XML", "data": "x"}}, "BINARY, JSON or STRING"),
        ({"key": "plain"}, "key must be an object"),
        ({"partition_id": -1}, "partition_id"),
        ({"partition_id": True}, "partition_id"),
        ({"timestamp": "2026-11-23T12:00:00"}, "no zone"),
        ({"timestamp": 1700000000000}, "ISO 8601"),
        ({"timestamp": "1969-12-31T23:59:59Z"}, "before 1970"),
        ({"headers": [{"name": "ordered.generation", "value": None}]}, "reserved"),
        ({"value": {"type": "JSON", "data": "\ud800"}}, "surrogate"),
    ],
)
def test_malformed_records_are_400_with_a_message(document: Any, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        decode(document)


def test_a_record_over_the_limit_is_413() -> None:
    with pytest.raises(PayloadTooLarge):
        v3_codec.decode_record(b'{"value": {"data": "AAAA"}}', max_record_bytes=10)


@pytest.mark.parametrize(
    "content_type", [None, "", "text/plain", "application/vnd.kafka.json.v2+json"]
)
def test_only_json_is_accepted(content_type: str | None) -> None:
    with pytest.raises(UnsupportedMediaType):
        v3_codec.check_content_type(content_type)


def test_json_with_a_utf8_charset_is_accepted() -> None:
    v3_codec.check_content_type("Application/JSON; charset=UTF-8")
    with pytest.raises(UnsupportedMediaType):
        v3_codec.check_content_type("application/json; charset=latin-1")


# Framing -------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
objects = st.dictionaries(st.text(), json_values, max_size=4)


@given(
    documents=st.lists(objects, max_size=6),
    separators=st.lists(st.sampled_from(["", " ", "\n", "\r\n", "\t "]), min_size=7, max_size=7),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
    ascii_only=st.booleans(),
)
def test_objects_come_out_whole_however_the_stream_is_cut(
    documents: list[dict[str, Any]], separators: list[str], cuts: list[int], ascii_only: bool
) -> None:
    texts = [json.dumps(d, ensure_ascii=ascii_only).encode() for d in documents]
    stream = b"".join(sep.encode() + text for sep, text in zip(separators, texts, strict=False))
    stream += separators[-1].encode()
    positions = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    splitter = v3_codec.ObjectSplitter(LIMIT)
    found: list[object] = []
    for start, end in itertools.pairwise(positions):
        found.extend(splitter.feed(stream[start:end]))
    splitter.finish()
    assert found == documents


def test_bytes_that_cannot_start_an_object_end_the_stream() -> None:
    splitter = v3_codec.ObjectSplitter(LIMIT)
    assert splitter.feed(b'{"a": 1} ') == [{"a": 1}]
    with pytest.raises(BadRequest, match="expected a JSON object"):
        splitter.feed(b'[{"a": 2}]')


def test_bad_json_inside_balanced_braces_is_one_bad_record() -> None:
    splitter = v3_codec.ObjectSplitter(LIMIT)
    bad, good = splitter.feed(b'{"a": 1,} {"b": "}"}')
    assert isinstance(bad, BadRequest)
    assert "not valid JSON" in bad.message
    assert good == {"b": "}"}
    (nan,) = splitter.feed(b'{"c": NaN}')
    assert isinstance(nan, BadRequest)


def test_a_stream_that_is_not_utf8_ends() -> None:
    splitter = v3_codec.ObjectSplitter(LIMIT)
    with pytest.raises(BadRequest, match="not UTF-8"):
        splitter.feed(b'{"a": "\xff"}')


def test_a_complete_record_over_the_limit_is_413_and_the_stream_goes_on() -> None:
    splitter = v3_codec.ObjectSplitter(40)
    big, small = splitter.feed(b'{"value": {"data": "' + b"A" * 40 + b'"}} {"value": null}')
    assert isinstance(big, PayloadTooLarge)
    assert small == {"value": None}


def test_an_object_left_open_is_400_at_the_end() -> None:
    splitter = v3_codec.ObjectSplitter(LIMIT)
    assert splitter.feed(b'{"a": "}') == []
    with pytest.raises(BadRequest, match="ended inside a record"):
        splitter.finish()


def test_an_object_growing_past_the_limit_is_413() -> None:
    splitter = v3_codec.ObjectSplitter(16)
    with pytest.raises(PayloadTooLarge):
        splitter.feed(b'{"value": "' + b"A" * 20)


def test_an_escaped_quote_split_across_chunks_stays_in_the_string() -> None:
    splitter = v3_codec.ObjectSplitter(LIMIT)
    assert splitter.feed(b'{"a": "x\\') == []
    assert splitter.feed(b'"}"') == []
    assert splitter.feed(b"}") == [{"a": 'x"}'}]


# Records shaped like v3's, each field any JSON at all: arbitrary values alone seldom reach
# the checks inside key and value (a "type" that is an object once answered 500).
def _any_or(*known: object) -> st.SearchStrategy[object]:
    return st.sampled_from(known) | json_values


record_shaped = st.fixed_dictionaries(
    {},
    optional={
        field: json_values
        | st.fixed_dictionaries(
            {},
            optional={
                "type": _any_or("BINARY", "JSON", "STRING", "AVRO"),
                "data": _any_or("AAAA", "a", {"x": 1}),
                "schema_id": json_values,
            },
        )
        for field in ("key", "value")
    }
    | {
        "partition_id": _any_or(0, 1),
        "timestamp": _any_or("2026-11-23T12:00:00Z"),
        "headers": st.lists(
            json_values
            | st.fixed_dictionaries({}, optional={"name": _any_or("h"), "value": _any_or("AA==")}),
            max_size=3,
        ),
    },
)


@given(
    body=st.binary(max_size=200)
    | st.builds(lambda v: json.dumps(v).encode(), json_values | record_shaped)
)
def test_any_malformed_body_is_a_4xx_never_another_error(body: bytes) -> None:
    refused: SidecarError | None = None
    try:
        for document in v3_codec.split_body(body, max_record_bytes=LIMIT):
            v3_codec.decode_document(document)
    except SidecarError as exc:
        refused = exc
    if refused is not None:
        assert 400 <= refused.http_status < 500
        assert v3_codec.error_body(refused)["error_code"] == refused.http_status


# Answers -------------------------------------------------------------------------------


def test_a_written_record_is_answered_in_rest_proxy_v3_shape() -> None:
    decoded = decode({"key": {"type": "STRING", "data": "k"}, "value": {"data": "AAE="}})
    body = v3_codec.written_body(
        RecordWritten(3, 41, 1795431600250), decoded, cluster_id="c1", topic="orders"
    )
    assert body == {
        "error_code": 200,
        "cluster_id": "c1",
        "topic_name": "orders",
        "partition_id": 3,
        "offset": 41,
        "timestamp": "2026-11-23T11:00:00.250Z",
        "key": {"type": "STRING", "size": 1},
        "value": {"type": "BINARY", "size": 2},
    }
    assert v3_codec.encode(body).endswith(b"}\n")


def test_errors_carry_the_http_status_and_the_sidecar_extensions() -> None:
    fenced = FencedGeneration("old", current_generation=4, current_count=6)
    assert v3_codec.error_body(fenced) == {
        "error_code": 409,
        "message": "old",
        "v2_error_code": 40910,
        "retriable": True,
        "current_generation": 4,
        "current_count": 6,
    }
    assert v3_codec.failed_body(RecordFailed(40402, "no partition")) == {
        "error_code": 404,
        "message": "no partition",
        "v2_error_code": 40402,
    }
    assert v3_codec.failed_body(RecordFailed(50002, "timeout"))["retriable"] is True
