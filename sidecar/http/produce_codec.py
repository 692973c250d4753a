"""Confluent REST Proxy v2 produce requests and responses, as pure functions.

Request: ``POST /topics/{topic}`` with a JSON body
``{"records": [{"key", "value", "partition"?, "headers"?}], ...}``. Accepted content
types (parameters such as ``charset=utf-8`` are allowed; another charset is not):

=======================================  ===========  =======================================
content type                             format       why
=======================================  ===========  =======================================
``application/vnd.kafka.json.v2+json``   json         REST Proxy v2
``application/vnd.kafka.binary.v2+json`` binary       REST Proxy v2
``application/json``                     json         see below
``application/vnd.kafka.v2+json``        refused 415  names no embedded format; v2 refuses it
avro / protobuf / jsonschema, other      refused 415  need a schema registry this sidecar lacks
=======================================  ===========  =======================================

REST Proxy v2 answers 415 to a produce sent as plain ``application/json``; only v1
read it as binary. So no client that works against a v2 proxy sends base64 under that
type, and the clients that do send it embed JSON values directly: reading it as the
json format accepts them without ever misreading a working v2 client's request.

Embedded formats. json: ``key``/``value`` are any JSON and are written as compact
UTF-8 JSON (as the proxy's Jackson mapper writes them). binary: they are standard
base64 strings with padding. In both, a ``null`` value is a tombstone (``value`` is
None, not empty bytes) and a ``null`` or absent key is no key. ``value`` itself must
be present, so a misspelt field cannot silently produce a tombstone. Header values
are base64 (or null) in both formats, as in REST Proxy v3.

Extensions of this project, each from the body or from an HTTP header:

=============================  ===============================  ==========================
body field                     header                           meaning
=============================  ===============================  ==========================
``expected_generation``        ``Ordered-Expected-Generation``  generation the app routed by
``expected_partition_count``   ``Ordered-Expected-Count``       undeleted count it expects
``idempotency_key``            ``Idempotency-Key``              a retry writes once
=============================  ===============================  ==========================

When both carry a value they must agree, otherwise the request is refused
(``BadRequest``): picking one silently could fence against a count the app never
meant (for example a header added by a proxy or an old client library). The
idempotency key header may use the quoted structured-field form of the IETF
``Idempotency-Key`` draft or a bare token.

Unknown fields in the request or in a record are refused, because a misspelt
``expected_generation`` ignored would turn a fenced produce into an unfenced one.
REST Proxy v2's schema fields (``key_schema``, ``key_schema_id``, ``value_schema``,
``value_schema_id``) are known: stock clients send them as null with json and binary
records, and null is accepted and ignored, as REST Proxy ignores them for these
formats. A schema given there is refused (422: the content type is fine, the records
cannot be written as asked): it needs a schema registry this sidecar does not use.

Response: as REST Proxy v2, status 200 with one entry per record in request order,
each either an offset or an error; this project adds ``generation`` and
``partition_count`` (what the records were routed with) at the top level.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Final, NotRequired, TypedDict, TypeVar

from sidecar.core.errors import (
    BadRequest,
    InvalidRecord,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from sidecar.core.produce import (
    EmbeddedFormat,
    OutgoingRecord,
    ProduceRequest,
    ProduceResult,
    RecordWritten,
)
from sidecar.http.json_body import json_type, parse_json, refuse_unknown_fields

V2_RESPONSE_CONTENT_TYPE: Final = "application/vnd.kafka.v2+json"
"""What REST Proxy v2 answers with, produce results and errors alike."""

EXPECTED_GENERATION_HEADER: Final = "Ordered-Expected-Generation"
EXPECTED_COUNT_HEADER: Final = "Ordered-Expected-Count"
IDEMPOTENCY_KEY_HEADER: Final = "Idempotency-Key"

RESERVED_HEADER_PREFIX: Final = "ordered."
"""Kafka record headers the sidecar writes itself; an app may not set them."""


@functools.lru_cache(maxsize=1024)
def is_reserved_header(name: str) -> bool:
    """True for a record header name the sidecar keeps for itself. Compared without case,
    so that a look-alike cannot confuse a case-insensitive reader. Cached: a records
    response asks it for every header of every record."""
    return name.lower().startswith(RESERVED_HEADER_PREFIX)


MAX_PARTITION: Final = 2**31 - 1
"""Kafka partition ids and counts are int32."""
MAX_GENERATION: Final = 2**63 - 1
MAX_IDEMPOTENCY_KEY_LENGTH: Final = 255

_T = TypeVar("_T")

_SCHEMA_FIELDS: Final = frozenset(
    {"key_schema", "key_schema_id", "value_schema", "value_schema_id"}
)
_REQUEST_FIELDS: Final = (
    frozenset({"records", "expected_generation", "expected_partition_count", "idempotency_key"})
    | _SCHEMA_FIELDS
)
_RECORD_FIELDS: Final = frozenset({"key", "value", "partition", "headers"})
_FAST_RECORD_FIELDS: Final = frozenset({"key", "value", "partition"})
"""A binary record with only these fields takes ``_decode_binary_record``'s fast path."""
_HEADER_FIELDS: Final = frozenset({"name", "value"})
_DECIMAL: Final = re.compile(r"[0-9]{1,19}")
# Visible ASCII only: the key is compared byte for byte and must survive an HTTP header.
_IDEMPOTENCY_KEY: Final = re.compile(rf"[\x21-\x7e]{{1,{MAX_IDEMPOTENCY_KEY_LENGTH}}}")
_UTF8_CHARSETS: Final = frozenset({"utf-8", "utf8"})
_NO_EMBEDDED_FORMAT: Final = "application/vnd.kafka.v2+json"
_SCHEMA_FORMATS: Final = re.compile(r"application/vnd\.kafka\.(avro|protobuf|jsonschema)\.v2\+json")


_FORMATS_BY_MEDIA_TYPE: Final[Mapping[str, EmbeddedFormat]] = {
    "application/vnd.kafka.json.v2+json": EmbeddedFormat.JSON,
    "application/vnd.kafka.binary.v2+json": EmbeddedFormat.BINARY,
    "application/json": EmbeddedFormat.JSON,
}


class OffsetEntry(TypedDict):
    partition: int | None
    offset: int | None
    error_code: int | None
    error: str | None


class ProduceResponseBody(TypedDict):
    key_schema_id: None
    value_schema_id: None
    offsets: list[OffsetEntry]
    generation: NotRequired[int]
    partition_count: NotRequired[int]


# Request ---------------------------------------------------------------------------------


def embedded_format(content_type: str | None) -> EmbeddedFormat:
    """The embedded format a ``Content-Type`` header selects.

    Raises UnsupportedMediaType for a missing, non-UTF-8 or unsupported type.
    """
    if content_type is None or not content_type.strip():
        raise UnsupportedMediaType(
            "Content-Type is missing; use application/vnd.kafka.json.v2+json "
            "or application/vnd.kafka.binary.v2+json"
        )
    media_type, *parameters = (part.strip() for part in content_type.split(";"))
    media_type = media_type.lower()
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() != "charset":
            continue
        charset = value.strip().strip('"').lower()
        if charset not in _UTF8_CHARSETS:
            raise UnsupportedMediaType(f"charset {charset!r} is not supported; JSON is UTF-8")
    found = _FORMATS_BY_MEDIA_TYPE.get(media_type)
    if found is not None:
        return found
    if media_type == _NO_EMBEDDED_FORMAT:
        raise UnsupportedMediaType(
            f"{media_type} names no embedded format; use application/vnd.kafka.json.v2+json "
            "or application/vnd.kafka.binary.v2+json"
        )
    schema_format = _SCHEMA_FORMATS.fullmatch(media_type)
    if schema_format is not None:
        raise UnsupportedMediaType(
            f"embedded format {schema_format.group(1)} needs a schema registry, which this "
            "sidecar does not use; send json or binary"
        )
    raise UnsupportedMediaType(f"content type {media_type!r} is not supported for produce")


def decode_produce_request(
    body: bytes,
    *,
    content_type: str | None,
    headers: Mapping[str, str],
    max_body_bytes: int,
) -> ProduceRequest:
    """Validate a REST Proxy v2 produce request into a ``ProduceRequest``.

    ``headers`` are the HTTP request headers (any mapping; names are matched
    case-insensitively and repeated headers, as in a multidict, are seen).

    Raises UnsupportedMediaType (content type), PayloadTooLarge (``body`` longer than
    ``max_body_bytes``), BadRequest (not JSON, wrong request shape, bad or conflicting
    extension) or InvalidRecord (a record's fields; the message names its index).
    """
    fmt = embedded_format(content_type)
    if len(body) > max_body_bytes:
        raise PayloadTooLarge(
            f"request body is {len(body)} bytes; the limit is {max_body_bytes} bytes"
        )
    document = parse_json(body)
    if not isinstance(document, dict):
        raise BadRequest(f"request body must be a JSON object, got {json_type(document)}")
    refuse_unknown_fields(document, _REQUEST_FIELDS, "request", BadRequest)
    _refuse_schemas(document)
    raw_records = document.get("records")
    if not isinstance(raw_records, list):
        raise BadRequest(
            "records is missing"
            if raw_records is None
            else f"records must be an array, got {json_type(raw_records)}"
        )
    if not raw_records:
        raise BadRequest("records is empty; send at least one record")
    decode_one = _decode_binary_record if fmt is EmbeddedFormat.BINARY else _decode_record
    records = tuple(decode_one(i, raw, fmt) for i, raw in enumerate(raw_records))
    return ProduceRequest(
        records=records,
        expected_generation=_agreed(
            _body_int(document, "expected_generation", 0, MAX_GENERATION),
            request_header_int(headers, EXPECTED_GENERATION_HEADER, 0, MAX_GENERATION),
            "expected_generation",
            EXPECTED_GENERATION_HEADER,
        ),
        expected_count=_agreed(
            _body_int(document, "expected_partition_count", 1, MAX_PARTITION),
            request_header_int(headers, EXPECTED_COUNT_HEADER, 1, MAX_PARTITION),
            "expected_partition_count",
            EXPECTED_COUNT_HEADER,
        ),
        idempotency_key=_agreed(
            _body_idempotency_key(document),
            _header_idempotency_key(headers),
            "idempotency_key",
            IDEMPOTENCY_KEY_HEADER,
        ),
        format=fmt,
    )


def _refuse_schemas(document: Mapping[str, object]) -> None:
    # Stock REST Proxy clients send all four as null with every json or binary request.
    given = sorted(field for field in _SCHEMA_FIELDS if document.get(field) is not None)
    if given:
        raise InvalidRecord(
            f"{', '.join(given)}: schemas need a schema registry, which this sidecar does "
            "not use; send json or binary records and leave the schema fields out or null"
        )


def _decode_binary_record(index: int, raw: object, fmt: EmbeddedFormat) -> OutgoingRecord:
    """``_decode_record`` for the binary format, first tried without building the
    messages a refusal would need: the checks per record cost more than the JSON parse
    and the base64 decoding of a 100-byte record together (bench/README.md, "The
    produce request's decoding"). Whatever the fast path does not take whole (headers,
    a field it does not know, a value that is not strict base64) goes through
    ``_decode_record``, which accepts the same and names what it refuses."""
    if type(raw) is dict and raw.keys() <= _FAST_RECORD_FIELDS and "value" in raw:
        key = raw.get("key")
        value = raw["value"]
        partition = raw.get("partition")
        try:
            # strict_mode accepts only canonical, padded base64 of the standard alphabet
            # (a subset of what b64decode(validate=True) accepts, decoded alike); a str
            # that is not ASCII raises ValueError, another JSON type TypeError.
            return OutgoingRecord(
                key=None if key is None else binascii.a2b_base64(key, strict_mode=True),
                value=None if value is None else binascii.a2b_base64(value, strict_mode=True),
                partition=(
                    partition
                    if partition is None
                    or (type(partition) is int and 0 <= partition <= MAX_PARTITION)
                    else _decode_partition(partition, f"records[{index}].partition")
                ),
                headers=(),
            )
        except (binascii.Error, ValueError, TypeError):
            pass
    return _decode_record(index, raw, fmt)


def _decode_record(index: int, raw: object, fmt: EmbeddedFormat) -> OutgoingRecord:
    where = f"records[{index}]"
    if not isinstance(raw, dict):
        raise InvalidRecord(f"{where} must be a JSON object, got {json_type(raw)}")
    refuse_unknown_fields(raw, _RECORD_FIELDS, where, InvalidRecord)
    if "value" not in raw:
        raise InvalidRecord(f"{where}.value is missing; send null for a tombstone")
    return OutgoingRecord(
        key=_decode_payload(raw.get("key"), fmt, f"{where}.key"),
        value=_decode_payload(raw["value"], fmt, f"{where}.value"),
        partition=_decode_partition(raw.get("partition"), f"{where}.partition"),
        headers=decode_headers(raw.get("headers"), f"{where}.headers"),
    )


def _decode_payload(raw: object, fmt: EmbeddedFormat, where: str) -> bytes | None:
    if raw is None:
        return None
    if fmt is EmbeddedFormat.BINARY:
        return decode_base64(raw, where)
    try:
        return json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        # json.loads lets "\ud800" through as a lone surrogate, which UTF-8 cannot encode.
        raise InvalidRecord(f"{where} contains a lone UTF-16 surrogate") from None


def decode_base64(raw: object, where: str) -> bytes:
    if not isinstance(raw, str):
        raise InvalidRecord(f"{where} must be a base64 string or null, got {json_type(raw)}")
    try:
        return base64.b64decode(raw.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise InvalidRecord(f"{where} is not valid base64 (standard alphabet, padded)") from None


def _decode_partition(raw: object, where: str) -> int | None:
    if raw is None:
        return None
    # bool is an int in Python but true is not a partition.
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= MAX_PARTITION:
        raise InvalidRecord(f"{where} must be an integer from 0 to {MAX_PARTITION}, got {raw!r}")
    return raw


def decode_headers(raw: object, where: str) -> tuple[tuple[str, bytes | None], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRecord(f"{where} must be an array, got {json_type(raw)}")
    return tuple(_decode_header(header, f"{where}[{i}]") for i, header in enumerate(raw))


def _decode_header(raw: object, where: str) -> tuple[str, bytes | None]:
    if not isinstance(raw, dict):
        raise InvalidRecord(f"{where} must be an object, got {json_type(raw)}")
    refuse_unknown_fields(raw, _HEADER_FIELDS, where, InvalidRecord)
    name = raw.get("name")
    if not isinstance(name, str):
        raise InvalidRecord(f"{where}.name must be a string, got {json_type(name)}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRecord(f"{where}.name contains a lone UTF-16 surrogate") from None
    if is_reserved_header(name):
        raise InvalidRecord(
            f"{where}.name {name!r} is reserved: headers starting with "
            f"{RESERVED_HEADER_PREFIX!r} are written by the sidecar"
        )
    if "value" not in raw:
        raise InvalidRecord(f"{where}.value is missing; send null for a header without value")
    value = raw["value"]
    return name, None if value is None else decode_base64(value, f"{where}.value")


# Extensions ------------------------------------------------------------------------------


def _body_int(document: Mapping[str, object], field: str, low: int, high: int) -> int | None:
    raw = document.get(field)
    if raw is None:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or not low <= raw <= high:
        raise BadRequest(f"{field} must be an integer from {low} to {high}, got {raw!r}")
    return raw


def request_header_int(headers: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    raw = _single_header(headers, name)
    if raw is None:
        return None
    # int() alone would also take "+5", "1_000" and non-ASCII digits.
    if _DECIMAL.fullmatch(raw) is None or not low <= int(raw) <= high:
        raise BadRequest(f"{name} must be a decimal integer from {low} to {high}, got {raw!r}")
    return int(raw)


def _body_idempotency_key(document: Mapping[str, object]) -> str | None:
    raw = document.get("idempotency_key")
    if raw is None:
        return None
    if not isinstance(raw, str) or _IDEMPOTENCY_KEY.fullmatch(raw) is None:
        raise BadRequest(
            f"idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} visible ASCII "
            f"characters, got {raw!r}"
        )
    return raw


def _header_idempotency_key(headers: Mapping[str, str]) -> str | None:
    raw = _single_header(headers, IDEMPOTENCY_KEY_HEADER)
    if raw is None:
        return None
    # The IETF draft sends a structured-field string ("..."); many APIs send a bare token.
    key = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    if _IDEMPOTENCY_KEY.fullmatch(key) is None:
        raise BadRequest(
            f"{IDEMPOTENCY_KEY_HEADER} must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} visible ASCII "
            f"characters, got {raw!r}"
        )
    return key


def _single_header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    values = {value.strip() for header, value in headers.items() if header.lower() == wanted}
    if len(values) > 1:
        raise BadRequest(f"{name} is sent more than once with different values")
    return values.pop() if values else None


def _agreed(from_body: _T | None, from_header: _T | None, field: str, header: str) -> _T | None:
    if from_body is not None and from_header is not None and from_body != from_header:
        raise BadRequest(
            f"{field} {from_body!r} in the body conflicts with {header}: {from_header!r}"
        )
    return from_body if from_body is not None else from_header


# Response --------------------------------------------------------------------------------


def produce_response_body(
    results: Sequence[ProduceResult], *, generation: int | None, partition_count: int | None
) -> ProduceResponseBody:
    """The REST Proxy v2 produce response for ``results`` (in request order).

    ``generation`` and ``partition_count`` are left out for an unmanaged topic (None).
    """
    body: ProduceResponseBody = {
        "key_schema_id": None,
        "value_schema_id": None,
        "offsets": [_offset_entry(result) for result in results],
    }
    if generation is not None:
        body["generation"] = generation
    if partition_count is not None:
        body["partition_count"] = partition_count
    return body


def encode_produce_response(
    results: Sequence[ProduceResult], *, generation: int | None, partition_count: int | None
) -> bytes:
    """``produce_response_body`` as UTF-8 JSON, to send as ``V2_RESPONSE_CONTENT_TYPE``.

    Written as text, byte for byte what ``json.dumps`` makes of the body (compact,
    UTF-8): an object per record costs more than the rest of the encoding."""
    tail = "]"
    if generation is not None:
        tail += f',"generation":{generation}'
    if partition_count is not None:
        tail += f',"partition_count":{partition_count}'
    offsets = ",".join(
        f'{{"partition":{result.partition},"offset":{result.offset},'
        '"error_code":null,"error":null}'
        if type(result) is RecordWritten
        else json.dumps(_offset_entry(result), separators=(",", ":"), ensure_ascii=False)
        for result in results
    )
    return f"{_RESPONSE_HEAD}{offsets}{tail}}}".encode()


_RESPONSE_HEAD: Final = '{"key_schema_id":null,"value_schema_id":null,"offsets":['


def _offset_entry(result: ProduceResult) -> OffsetEntry:
    if isinstance(result, RecordWritten):
        return {
            "partition": result.partition,
            "offset": result.offset,
            "error_code": None,
            "error": None,
        }
    return {
        "partition": None,
        "offset": None,
        "error_code": result.error_code,
        "error": result.message,
    }
