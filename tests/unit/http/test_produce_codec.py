"""REST Proxy v2 produce codec: content types, validation messages, extensions, response."""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from sidecar.core.errors import (
    BadRequest,
    InvalidRecord,
    KafkaUnavailable,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from sidecar.core.produce import (
    EmbeddedFormat,
    OutgoingRecord,
    ProduceRequest,
    ProduceResult,
    RecordFailed,
    RecordWritten,
)
from sidecar.http.produce_codec import (
    MAX_GENERATION,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    MAX_PARTITION,
    decode_produce_request,
    embedded_format,
    encode_produce_response,
    produce_response_body,
)

JSON_V2 = "application/vnd.kafka.json.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"
LIMIT = 1 << 20
NO_HEADERS: Mapping[str, str] = {}

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
header_names = st.text().filter(lambda name: not name.lower().startswith("ordered."))
optional_bytes = st.none() | st.binary(max_size=64)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode_raw(
    body: bytes,
    content_type: str | None = BINARY_V2,
    headers: Mapping[str, str] = NO_HEADERS,
    max_body_bytes: int = LIMIT,
) -> ProduceRequest:
    return decode_produce_request(
        body, content_type=content_type, headers=headers, max_body_bytes=max_body_bytes
    )


def decode(
    document: object,
    content_type: str | None = BINARY_V2,
    headers: Mapping[str, str] = NO_HEADERS,
) -> ProduceRequest:
    return decode_raw(json.dumps(document).encode("utf-8"), content_type, headers)


def one_record(**fields: object) -> dict[str, object]:
    return {"records": [fields]}


# Content types -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        (JSON_V2, EmbeddedFormat.JSON),
        (BINARY_V2, EmbeddedFormat.BINARY),
        ("application/json", EmbeddedFormat.JSON),
        ("application/json; charset=utf-8", EmbeddedFormat.JSON),
        ('application/vnd.kafka.binary.v2+json; charset="UTF-8"', EmbeddedFormat.BINARY),
        ("Application/VND.Kafka.JSON.v2+JSON", EmbeddedFormat.JSON),
    ],
)
def test_supported_content_types(content_type: str, expected: EmbeddedFormat) -> None:
    assert embedded_format(content_type) is expected


@pytest.mark.parametrize(
    ("content_type", "message"),
    [
        (None, "Content-Type is missing"),
        ("  ", "Content-Type is missing"),
        ("application/vnd.kafka.v2+json", "names no embedded format"),
        ("application/vnd.kafka.avro.v2+json", "embedded format avro needs a schema registry"),
        ("application/vnd.kafka.protobuf.v2+json", "embedded format protobuf"),
        ("application/vnd.kafka.jsonschema.v2+json", "embedded format jsonschema"),
        ("application/vnd.kafka.binary.v1+json", "'application/vnd.kafka.binary.v1+json'"),
        ("text/plain", "content type 'text/plain' is not supported"),
        ("application/json; charset=iso-8859-1", "charset 'iso-8859-1' is not supported"),
    ],
)
def test_unsupported_content_types(content_type: str | None, message: str) -> None:
    with pytest.raises(UnsupportedMediaType, match=re.escape(message)):
        decode(one_record(value=None), content_type=content_type)


# Request shape -------------------------------------------------------------------------


def test_body_over_the_limit_is_refused_and_at_the_limit_accepted() -> None:
    body = json.dumps(one_record(value=None)).encode()
    assert decode_raw(body, max_body_bytes=len(body)).records[0].value is None
    with pytest.raises(PayloadTooLarge, match=f"is {len(body)} bytes; the limit is 10 bytes"):
        decode_raw(body, max_body_bytes=10)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not valid JSON: Expecting value at line 1 column 1"),
        (b'{"records": [', "not valid JSON"),
        (b"\xff{}", "not UTF-8 (byte 0"),
        (b'{"records": [{"value": NaN}]}', "NaN is not a JSON value"),
        (b'{"records": [{"value": -Infinity}]}', "-Infinity is not a JSON value"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"records": [{"value": ' + b"9" * 5000 + b"}]}", "not valid JSON"),
        (b"[]", "must be a JSON object, got array"),
        (b'"records"', "must be a JSON object, got string"),
        (b"{}", "records is missing"),
        (b'{"records": null}', "records is missing"),
        (b'{"records": {}}', "records must be an array, got object"),
        (b'{"records": []}', "records is empty"),
        (
            b'{"records": [{"value": null}], "key_schemas": null}',
            "unknown field(s) ['key_schemas']",
        ),
    ],
)
def test_malformed_requests_are_bad_requests(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        decode_raw(body)


def test_rest_proxy_schema_fields_sent_as_null_are_accepted_and_ignored() -> None:
    nulls = {"key_schema": None, "key_schema_id": None, "value_schema": None}
    body = json.dumps({"records": [{"value": "YQ=="}], "value_schema_id": None} | nulls)
    for content_type in ("application/vnd.kafka.binary.v2+json", "application/json"):
        request = decode_raw(body.encode(), content_type=content_type)
        assert len(request.records) == 1


@pytest.mark.parametrize(
    "schema",
    [
        {"value_schema": '{"type": "string"}'},
        {"key_schema_id": 3},
        {"value_schema_id": 0, "key_schema": None},
    ],
)
def test_a_schema_is_refused_it_needs_a_schema_registry(schema: dict[str, object]) -> None:
    body = json.dumps({"records": [{"value": 1}]} | schema).encode()
    with pytest.raises(InvalidRecord, match="need a schema registry"):
        decode_raw(body)


# Records -------------------------------------------------------------------------------

VALID = {"value": None}


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (5, "records[1] must be a JSON object, got number"),
        ([], "records[1] must be a JSON object, got array"),
        ({"key": b64(b"k")}, "records[1].value is missing; send null for a tombstone"),
        ({"vaule": "YQ=="}, "records[1] has unknown field(s) ['vaule']"),
        ({"value": "!!!!"}, "records[1].value is not valid base64"),
        ({"value": "YQ"}, "records[1].value is not valid base64"),
        ({"value": "é"}, "records[1].value is not valid base64"),
        ({"value": {"a": 1}}, "records[1].value must be a base64 string or null, got object"),
        ({"key": 5, "value": None}, "records[1].key must be a base64 string or null, got number"),
        (
            {"key": True, "value": None},
            "records[1].key must be a base64 string or null, got boolean",
        ),
        ({"value": None, "partition": -1}, "records[1].partition must be an integer from 0"),
        ({"value": None, "partition": "1"}, "records[1].partition must be an integer from 0"),
        ({"value": None, "partition": True}, "records[1].partition must be an integer from 0"),
        ({"value": None, "partition": 1.0}, "records[1].partition must be an integer from 0"),
        ({"value": None, "partition": 2**31}, "records[1].partition must be an integer from 0"),
        ({"value": None, "headers": {}}, "records[1].headers must be an array, got object"),
        ({"value": None, "headers": ["h"]}, "records[1].headers[0] must be an object, got string"),
        (
            {"value": None, "headers": [{"name": 1, "value": None}]},
            "records[1].headers[0].name must be a string, got number",
        ),
        (
            {"value": None, "headers": [{"value": None}]},
            "records[1].headers[0].name must be a string, got null",
        ),
        (
            {"value": None, "headers": [{"name": "a"}]},
            "records[1].headers[0].value is missing",
        ),
        (
            {"value": None, "headers": [{"name": "a", "value": "@@"}]},
            "records[1].headers[0].value is not valid base64",
        ),
        (
            {"value": None, "headers": [{"name": "a", "value": 7}]},
            "records[1].headers[0].value must be a base64 string or null, got number",
        ),
        (
            {"value": None, "headers": [{"name": "a", "value": None, "type": "x"}]},
            "records[1].headers[0] has unknown field(s) ['type']",
        ),
        (
            {"value": None, "headers": [{"name": "a", "value": None}, {"name": "\ud800"}]},
            "records[1].headers[1].name contains a lone UTF-16 surrogate",
        ),
        (
            {"value": None, "headers": [{"name": "ordered.generation", "value": None}]},
            "records[1].headers[0].name 'ordered.generation' is reserved",
        ),
        (
            {"value": None, "headers": [{"name": "Ordered.Trace", "value": None}]},
            "records[1].headers[0].name 'Ordered.Trace' is reserved",
        ),
    ],
)
def test_invalid_binary_records_name_index_and_field(record: object, message: str) -> None:
    with pytest.raises(InvalidRecord, match=re.escape(message)):
        decode({"records": [VALID, record]})


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"key": "k"}, "records[1].value is missing"),
        ({"value": "\ud800"}, "records[1].value contains a lone UTF-16 surrogate"),
        ({"key": ["\udfff"], "value": 1}, "records[1].key contains a lone UTF-16 surrogate"),
        ({"value": 1, "partition": -3}, "records[1].partition must be an integer from 0"),
    ],
)
def test_invalid_json_records_name_index_and_field(record: object, message: str) -> None:
    with pytest.raises(InvalidRecord, match=re.escape(message)):
        decode({"records": [VALID, record]}, content_type=JSON_V2)


def test_binary_record_with_key_partition_and_headers() -> None:
    request = decode(
        one_record(
            key=b64(b"\x00key"),
            value=b64(b"\xffvalue"),
            partition=3,
            headers=[{"name": "trace", "value": b64(b"abc")}, {"name": "flag", "value": None}],
        )
    )
    assert request == ProduceRequest(
        records=(
            OutgoingRecord(
                key=b"\x00key",
                value=b"\xffvalue",
                partition=3,
                headers=(("trace", b"abc"), ("flag", None)),
            ),
        ),
        expected_generation=None,
        expected_count=None,
        idempotency_key=None,
        format=EmbeddedFormat.BINARY,
    )


@pytest.mark.parametrize("content_type", [BINARY_V2, JSON_V2])
def test_null_value_is_a_tombstone_and_null_or_absent_key_is_no_key(content_type: str) -> None:
    request = decode({"records": [{"value": None}, {"key": None, "value": None}]}, content_type)
    assert [(r.key, r.value) for r in request.records] == [(None, None), (None, None)]


def test_empty_base64_value_is_empty_bytes_not_a_tombstone() -> None:
    assert decode(one_record(value="")).records[0].value == b""


def test_json_format_writes_compact_utf8_json_in_field_order() -> None:
    request = decode(
        one_record(key="user-1", value={"b": [1, 2.5, "é"], "a": None, "s": "null"}, partition=0),
        content_type=JSON_V2,
    )
    (record,) = request.records
    assert record.key == b'"user-1"'
    assert record.value == '{"b":[1,2.5,"é"],"a":null,"s":"null"}'.encode()
    assert record.partition == 0
    assert request.format is EmbeddedFormat.JSON


def test_json_format_headers_are_still_base64() -> None:
    request = decode(
        one_record(value=1, headers=[{"name": "h", "value": b64(b"v")}]), content_type=JSON_V2
    )
    assert request.records[0].headers == (("h", b"v"),)


def test_records_keep_request_order() -> None:
    values = [b64(bytes([i])) for i in range(5)]
    request = decode({"records": [{"value": v} for v in values]})
    assert [r.value for r in request.records] == [bytes([i]) for i in range(5)]


# Extensions ----------------------------------------------------------------------------


def test_extensions_from_the_body() -> None:
    request = decode(
        {
            "records": [VALID],
            "expected_generation": 0,
            "expected_partition_count": 12,
            "idempotency_key": "order-42/attempt",
        }
    )
    assert (request.expected_generation, request.expected_count, request.idempotency_key) == (
        0,
        12,
        "order-42/attempt",
    )


def test_extensions_from_headers_match_names_case_insensitively() -> None:
    headers = {
        "ordered-expected-generation": " 7 ",
        "ORDERED-EXPECTED-COUNT": "12",
        "idempotency-key": '"8e03978e-40d5-43e8-bc93-6894a57f9324"',
    }
    request = decode({"records": [VALID]}, headers=headers)
    assert (request.expected_generation, request.expected_count, request.idempotency_key) == (
        7,
        12,
        "8e03978e-40d5-43e8-bc93-6894a57f9324",
    )


def test_body_and_header_may_repeat_the_same_value() -> None:
    headers = {"Ordered-Expected-Generation": "3", "Idempotency-Key": "abc"}
    document = {"records": [VALID], "expected_generation": 3, "idempotency_key": "abc"}
    request = decode(document, headers=headers)
    assert (request.expected_generation, request.idempotency_key) == (3, "abc")


@pytest.mark.parametrize(
    ("field", "header", "body_value", "header_value"),
    [
        ("expected_generation", "Ordered-Expected-Generation", 3, "4"),
        ("expected_partition_count", "Ordered-Expected-Count", 8, "9"),
        ("idempotency_key", "Idempotency-Key", "a", "b"),
    ],
)
def test_body_and_header_that_disagree_are_refused(
    field: str, header: str, body_value: object, header_value: str
) -> None:
    with pytest.raises(BadRequest, match=f"{field} .* in the body conflicts with {header}"):
        decode({"records": [VALID], field: body_value}, headers={header: header_value})


def test_a_header_repeated_with_different_values_is_refused() -> None:
    headers = CIMultiDict([("Ordered-Expected-Count", "4"), ("ordered-expected-count", "5")])
    with pytest.raises(BadRequest, match="Ordered-Expected-Count is sent more than once"):
        decode({"records": [VALID]}, headers=headers)


def test_a_header_repeated_with_the_same_value_is_accepted() -> None:
    headers = CIMultiDict([("Ordered-Expected-Count", "4"), ("Ordered-Expected-Count", "4")])
    assert decode({"records": [VALID]}, headers=headers).expected_count == 4


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("expected_generation", -1),
        ("expected_generation", "3"),
        ("expected_generation", True),
        ("expected_generation", 1.5),
        ("expected_generation", MAX_GENERATION + 1),
        ("expected_partition_count", 0),
        ("expected_partition_count", MAX_PARTITION + 1),
        ("idempotency_key", ""),
        ("idempotency_key", "has space"),
        ("idempotency_key", "ключ"),
        ("idempotency_key", 42),
        ("idempotency_key", "k" * (MAX_IDEMPOTENCY_KEY_LENGTH + 1)),
    ],
)
def test_bad_extension_in_the_body(field: str, value: object) -> None:
    with pytest.raises(BadRequest, match=f"^{field} must be"):
        decode({"records": [VALID], field: value})


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Ordered-Expected-Generation", ""),
        ("Ordered-Expected-Generation", "-1"),
        ("Ordered-Expected-Generation", "+5"),
        ("Ordered-Expected-Generation", "1_000"),
        ("Ordered-Expected-Generation", "٣"),
        ("Ordered-Expected-Generation", "99999999999999999999"),
        ("Ordered-Expected-Count", "0"),
        ("Ordered-Expected-Count", "2147483648"),
        ("Idempotency-Key", '""'),
        ("Idempotency-Key", '"a b"'),
    ],
)
def test_bad_extension_header(header: str, value: str) -> None:
    with pytest.raises(BadRequest, match=f"^{header} must be"):
        decode({"records": [VALID]}, headers={header: value})


def test_longest_idempotency_key_is_accepted() -> None:
    key = "k" * MAX_IDEMPOTENCY_KEY_LENGTH
    assert decode({"records": [VALID], "idempotency_key": key}).idempotency_key == key


# Response ------------------------------------------------------------------------------


def test_response_is_rest_proxy_v2_shape_plus_generation() -> None:
    results: list[ProduceResult] = [
        RecordWritten(partition=2, offset=41),
        RecordFailed.from_error(KafkaUnavailable("leader not available")),
    ]
    encoded = encode_produce_response(results, generation=5, partition_count=12)
    assert encoded == (
        b'{"key_schema_id":null,"value_schema_id":null,"offsets":['
        b'{"partition":2,"offset":41,"error_code":null,"error":null},'
        b'{"partition":null,"offset":null,"error_code":50002,"error":"leader not available"}'
        b'],"generation":5,"partition_count":12}'
    )
    assert json.loads(encoded) == produce_response_body(results, generation=5, partition_count=12)


# Properties ----------------------------------------------------------------------------


@given(
    key=optional_bytes,
    value=optional_bytes,
    partition=st.none() | st.integers(min_value=0, max_value=MAX_PARTITION),
    headers=st.lists(st.tuples(header_names, optional_bytes), max_size=4),
)
def test_any_bytes_survive_the_binary_format(
    key: bytes | None,
    value: bytes | None,
    partition: int | None,
    headers: list[tuple[str, bytes | None]],
) -> None:
    def encoded(data: bytes | None) -> str | None:
        return None if data is None else b64(data)

    record = {
        "key": encoded(key),
        "value": encoded(value),
        "partition": partition,
        "headers": [{"name": name, "value": encoded(data)} for name, data in headers],
    }
    decoded = decode({"records": [record]}).records[0]
    assert decoded == OutgoingRecord(key, value, partition, tuple(headers))


@given(key=json_values, value=json_values)
def test_any_json_value_survives_the_json_format(key: object, value: object) -> None:
    decoded = decode(one_record(key=key, value=value), content_type=JSON_V2).records[0]
    assert (None if decoded.key is None else json.loads(decoded.key)) == key
    assert (None if decoded.value is None else json.loads(decoded.value)) == value


@given(
    from_body=st.none() | st.integers(min_value=0, max_value=3),
    from_header=st.none() | st.integers(min_value=0, max_value=3),
)
def test_expectation_is_whichever_is_given_and_both_must_agree(
    from_body: int | None, from_header: int | None
) -> None:
    headers = {} if from_header is None else {"Ordered-Expected-Generation": str(from_header)}
    document = {"records": [VALID], "expected_generation": from_body}
    if from_body is not None and from_header is not None and from_body != from_header:
        with pytest.raises(BadRequest):
            decode(document, headers=headers)
    else:
        expected = from_body if from_body is not None else from_header
        assert decode(document, headers=headers).expected_generation == expected


record_fields = st.dictionaries(
    st.sampled_from(["key", "value", "partition", "headers"]),
    json_values | st.lists(st.dictionaries(st.sampled_from(["name", "value"]), json_values)),
)


@given(
    document=json_values
    | st.fixed_dictionaries({"records": st.lists(record_fields | json_values, max_size=3)}),
    content_type=st.sampled_from([JSON_V2, BINARY_V2]),
)
def test_any_json_document_decodes_or_is_refused_as_a_client_error(
    document: object, content_type: str
) -> None:
    # Anything else escaping (TypeError, RecursionError, ...) fails the test.
    with contextlib.suppress(BadRequest, InvalidRecord):
        decode(document, content_type=content_type)


@given(body=st.binary(max_size=256))
def test_any_body_bytes_decode_or_are_refused_as_sidecar_errors(body: bytes) -> None:
    with contextlib.suppress(BadRequest, InvalidRecord, PayloadTooLarge):
        decode_raw(body, max_body_bytes=128)


# The binary fast path and the text-written response against their definitions ----------

_BASE64_ALIKE = st.one_of(
    st.binary(max_size=12).map(lambda data: base64.b64encode(data).decode()),
    # Near misses: padding dropped or doubled, a character of another alphabet, spaces,
    # non-ASCII text, trailing garbage after the padding.
    st.binary(min_size=1, max_size=12).map(lambda data: base64.b64encode(data).decode()[:-1]),
    st.binary(max_size=12).map(lambda data: base64.b64encode(data).decode() + "="),
    st.binary(max_size=12).map(lambda data: base64.urlsafe_b64encode(data).decode()),
    st.binary(max_size=12).map(lambda data: " " + base64.b64encode(data).decode()),
    st.binary(max_size=12).map(lambda data: base64.b64encode(data).decode() + "=QQ=="),
    st.text(max_size=8),
)
_JSON_VALUES = st.one_of(
    st.none(), _BASE64_ALIKE, st.integers(), st.booleans(), st.lists(st.integers(), max_size=2)
)
_RAW_RECORDS = st.one_of(
    st.dictionaries(
        st.sampled_from(["key", "value", "partition", "headers", "keys", "timestamp"]),
        st.one_of(
            _JSON_VALUES,
            st.integers(-2, 2**31),
            st.lists(st.fixed_dictionaries({"name": st.just("h"), "value": _BASE64_ALIKE})),
        ),
        max_size=5,
    ),
    _JSON_VALUES,
)


def _decoded_or_refusal(decode: object, raw: object) -> object:
    try:
        return decode(7, raw, EmbeddedFormat.BINARY)  # type: ignore[operator]
    except InvalidRecord as exc:
        return ("refused", exc.message)


_PLAIN_RECORDS = st.fixed_dictionaries(
    {"value": st.none() | _BASE64_ALIKE},
    optional={"key": st.none() | _BASE64_ALIKE, "partition": st.none() | st.integers(-1, 2**31)},
)


@settings(max_examples=300)
@given(_PLAIN_RECORDS | _RAW_RECORDS)
def test_binary_fast_path_decodes_and_refuses_as_the_checked_path(raw: object) -> None:
    # The fast path skips the per-field checks' messages; it must accept, decode and
    # refuse exactly what the checked path does, with the same message.
    from sidecar.http import produce_codec

    assert _decoded_or_refusal(produce_codec._decode_binary_record, raw) == _decoded_or_refusal(
        produce_codec._decode_record, raw
    )


_RESULTS = st.lists(
    st.one_of(
        st.builds(
            RecordWritten,
            st.integers(0, MAX_PARTITION),
            st.integers(0, 2**63 - 1),
            st.none() | st.integers(0, 2**45),
        ),
        st.builds(RecordFailed, st.integers(40000, 50399), st.text()),
    ),
    max_size=6,
)


@given(_RESULTS, st.none() | st.integers(0, MAX_GENERATION), st.none() | st.integers(1, 99))
def test_produce_response_text_is_the_compact_json_of_its_body(
    results: list[ProduceResult], generation: int | None, count: int | None
) -> None:
    body = produce_response_body(results, generation=generation, partition_count=count)
    try:
        expected: bytes | str = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate in a message fails both alike
        expected = "UnicodeEncodeError"
    try:
        encoded: bytes | str = encode_produce_response(
            results, generation=generation, partition_count=count
        )
    except UnicodeEncodeError:
        encoded = "UnicodeEncodeError"
    assert encoded == expected
