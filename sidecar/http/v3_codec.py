"""Confluent REST Proxy v3 produce records and their answers, as pure functions.

Request: ``POST /v3/clusters/{cluster_id}/topics/{topic_name}/records`` with one JSON
object per record, several concatenated (whitespace or newlines between them allowed)::

    {"partition_id": 1, "headers": [{"name": "h", "value": "<base64>"}],
     "key": {"type": "STRING", "data": "k"}, "value": {"type": "JSON", "data": {"a": 1}},
     "timestamp": "2026-11-23T12:00:00.000Z"}

Every field is optional. ``key`` and ``value`` are ``{"type", "data"}`` objects:

==========  ========================================================================
type        ``data``
==========  ========================================================================
``BINARY``  a standard base64 string (padded); the default when ``type`` is absent
``JSON``    any JSON, written as compact UTF-8 JSON (as REST Proxy's mapper writes it)
``STRING``  a string, written as UTF-8
==========  ========================================================================

``data`` null or absent, or ``key``/``value`` absent or null, is no key / a tombstone, as
in REST Proxy v3. REST Proxy's schema types (AVRO, PROTOBUF, JSONSCHEMA) and schema
fields (``schema``, ``schema_id``, ``schema_version``, ``subject``,
``subject_name_strategy``) need a schema registry, which this sidecar does not use: a
record naming them is refused (422), as REST Proxy refuses what it cannot serialize.
Unknown fields are refused (400), as REST Proxy's strict mapper does. Header values are
base64 or null, and names starting with ``ordered.`` are the sidecar's own (the v2
codec's rules, shared). ``timestamp`` is an ISO 8601 instant with a zone (``Z`` or an
offset); without it Kafka's producer stamps the record when it is sent.

Answers: each record gets ``{"error_code": 200, "cluster_id", "topic_name",
"partition_id", "offset", "timestamp", "key": {"type", "size"}, "value": {"type",
"size"}}`` (``key``/``value`` only when the record had one), or an error in v3's shape.

Errors in v3 shape: ``{"error_code": <HTTP status>, "message": "..."}``. REST Proxy v3
answers HTTP status codes there (400, 404, 422, ...), not v2's five-digit ones. The
sidecar's own five-digit code, which tells apart errors of one status (fenced 40910 from
read-only partition 40902, for example), is kept as ``v2_error_code``, with the v2
extensions ``retriable``, ``current_generation`` and ``current_count`` unchanged.

Records of a stream are cut out by ``ObjectSplitter``: each is parsed where it starts,
and one that does not parse is framed by its braces and strings, so a record whose
braces balance but whose JSON is wrong is one bad record (the stream goes on); bytes
that cannot start an object, or are not UTF-8, end the stream (nothing after them can
be told apart), as a parse error ends a REST Proxy stream.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from sidecar.core.errors import (
    BadRequest,
    FencedGeneration,
    InvalidRecord,
    PayloadTooLarge,
    SidecarError,
    UnsupportedMediaType,
)
from sidecar.core.produce import OutgoingRecord, RecordFailed, RecordWritten
from sidecar.http.json_body import json_type, parse_json, refuse_constant, refuse_unknown_fields

# The v2 codec's helpers: one set of rules for headers and base64 in both APIs (a
# header the v2 route refuses is refused here with the same message).
from sidecar.http.produce_codec import MAX_PARTITION, decode_base64, decode_headers

V3_CONTENT_TYPE: Final = "application/json"

MAX_TIMESTAMP_MS: Final = 253402300799999
"""9999-12-31T23:59:59.999Z: the last instant ISO 8601 writes with four year digits."""

_RECORD_FIELDS: Final = frozenset({"partition_id", "headers", "key", "value", "timestamp"})
_DATA_FIELDS: Final = frozenset({"type", "data"})
_SCHEMA_FIELDS: Final = frozenset(
    {"schema", "schema_id", "schema_version", "subject", "subject_name_strategy"}
)
_SCHEMA_TYPES: Final = frozenset({"AVRO", "PROTOBUF", "JSONSCHEMA"})
_PLAIN_TYPES: Final = ("BINARY", "JSON", "STRING")
_UTF8_CHARSETS: Final = frozenset({"utf-8", "utf8"})
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
# One encoder for every answer and JSON value: json.dumps with these arguments would
# build a new one per call.
_COMPACT: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class V3Record:
    """One decoded v3 record; ``key_type``/``value_type`` are None when it had none."""

    record: OutgoingRecord
    key_type: str | None
    value_type: str | None


# Content type -----------------------------------------------------------------------------


def check_content_type(content_type: str | None) -> None:
    """Raises UnsupportedMediaType unless ``content_type`` is JSON in UTF-8."""
    if content_type is None or not content_type.strip():
        raise UnsupportedMediaType("Content-Type is missing; send application/json")
    media_type, *parameters = (part.strip() for part in content_type.split(";"))
    if media_type.lower() != V3_CONTENT_TYPE:
        raise UnsupportedMediaType(
            f"content type {media_type.lower()[:100]!r} is not supported; send application/json"
        )
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in _UTF8_CHARSETS:
            raise UnsupportedMediaType(f"charset {charset[:40]!r} is not supported; JSON is UTF-8")


# Records ------------------------------------------------------------------------------------


def decode_record(raw: bytes, *, max_record_bytes: int) -> V3Record:
    """Validate one record's JSON text (as ``decode_document`` does its parsed form).

    Raises PayloadTooLarge, BadRequest (not JSON, unknown field, wrong type) or
    InvalidRecord (a schema type or field, which needs a schema registry).
    """
    if len(raw) > max_record_bytes:
        raise PayloadTooLarge(f"record is {len(raw)} bytes; the limit is {max_record_bytes} bytes")
    return decode_document(parse_json(raw))


def decode_document(document: object) -> V3Record:
    """Validate one record's parsed JSON (what ``ObjectSplitter`` yields).

    Raises BadRequest (unknown field, wrong type) or InvalidRecord (a schema type or
    field, which needs a schema registry).
    """
    if not isinstance(document, dict):
        raise BadRequest(f"a record must be a JSON object, got {json_type(document)}")
    refuse_unknown_fields(document, _RECORD_FIELDS, "record", BadRequest)
    key, key_type = _decode_data(document.get("key"), "key")
    value, value_type = _decode_data(document.get("value"), "value")
    try:
        headers = decode_headers(document.get("headers"), "headers")
    except InvalidRecord as exc:
        raise BadRequest(exc.message) from None
    return V3Record(
        record=OutgoingRecord(
            key=key,
            value=value,
            partition=_decode_partition_id(document.get("partition_id")),
            headers=headers,
            timestamp_ms=_decode_timestamp(document.get("timestamp")),
        ),
        key_type=key_type,
        value_type=value_type,
    )


def _decode_data(raw: object, where: str) -> tuple[bytes | None, str | None]:
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise BadRequest(f"{where} must be an object with type and data, got {json_type(raw)}")
    schema_fields = sorted(raw.keys() & _SCHEMA_FIELDS)
    if schema_fields:
        raise InvalidRecord(
            f"{where}: {', '.join(schema_fields)} need a schema registry, which this sidecar "
            "does not use; send type BINARY, JSON or STRING"
        )
    refuse_unknown_fields(raw, _DATA_FIELDS, where, BadRequest)
    kind = raw.get("type", "BINARY")
    if not isinstance(kind, str):
        raise BadRequest(f"{where}.type must be BINARY, JSON or STRING, got {json_type(kind)}")
    if kind in _SCHEMA_TYPES:
        raise InvalidRecord(
            f"{where}.type {kind} needs a schema registry, which this sidecar does not use; "
            "send type BINARY, JSON or STRING"
        )
    if kind not in _PLAIN_TYPES:
        raise BadRequest(f"{where}.type must be BINARY, JSON or STRING, got {kind[:40]!r}")
    data = raw.get("data")
    if data is None:
        return None, kind
    if kind == "BINARY":
        try:
            return decode_base64(data, f"{where}.data"), kind
        except InvalidRecord as exc:
            raise BadRequest(exc.message) from None
    if kind == "STRING":
        if not isinstance(data, str):
            raise BadRequest(f"{where}.data must be a string for STRING, got {json_type(data)}")
        return _utf8(data, where), kind
    return _utf8(_COMPACT.encode(data), where), kind


def _utf8(text: str, where: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # json.loads lets "\ud800" through as a lone surrogate, which UTF-8 cannot encode.
        raise BadRequest(f"{where}.data contains a lone UTF-16 surrogate") from None


def _decode_partition_id(raw: object) -> int | None:
    if raw is None:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= MAX_PARTITION:
        raise BadRequest(f"partition_id must be an integer from 0 to {MAX_PARTITION}, got {raw!r}")
    return raw


def _decode_timestamp(raw: object) -> int | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise BadRequest(f"timestamp must be an ISO 8601 string, got {json_type(raw)}")
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise BadRequest(f"timestamp {raw[:60]!r} is not an ISO 8601 instant") from None
    if moment.tzinfo is None:
        raise BadRequest(f"timestamp {raw[:60]!r} has no zone; end it with Z or an offset")
    try:
        # Exact: a float of seconds would turn .123 into 122 ms now and then.
        millis = (moment - _EPOCH) // timedelta(milliseconds=1)
    except OverflowError:
        raise BadRequest(f"timestamp {raw[:60]!r} is out of range") from None
    if not 0 <= millis <= MAX_TIMESTAMP_MS:
        raise BadRequest(f"timestamp {raw[:60]!r} is before 1970 or after 9999")
    return millis


# Stream framing -------------------------------------------------------------------------------

# Outside a string, what can change the brace depth or start a string; inside one, what
# can end it. re scans in C, so a long string or base64 value is one step.
_OUTSIDE: Final = re.compile(r'[{}"]')
_INSIDE: Final = re.compile(r'["\\]')
_NOT_WHITESPACE: Final = re.compile(r"[^ \t\r\n]")
_DECODER: Final = json.JSONDecoder(parse_constant=refuse_constant)

Framed = object
"""What ``ObjectSplitter`` cuts out: a record's parsed JSON, or the SidecarError that
says why it is not one (not JSON, too large); the stream goes on after either."""


class ObjectSplitter:
    """Cuts a byte stream of concatenated JSON objects into their parsed documents.

    The common case costs one C call per object: each is parsed where it starts
    (``raw_decode``). Only an object that does not parse there, because it has not all
    arrived or is not valid JSON, is framed by following braces and strings (resumed
    as bytes arrive); one with wrong JSON inside balanced braces is then one bad record.
    ``feed`` raises BadRequest when the stream is not UTF-8 or holds something other
    than an object where one must start, and PayloadTooLarge when an unfinished object
    grows past ``max_object_bytes``; the stream cannot be read further after either.
    """

    def __init__(self, max_object_bytes: int) -> None:
        self._max = max_object_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = ""  # decoded and not yet cut out
        self._open = False  # an object begun and not complete is being framed
        self._start = 0  # where that object starts in ``_text``
        self._scan = 0  # where its framing resumes
        self._depth = 0
        self._in_string = False
        self._consumed = 0  # characters before ``_text``, for messages

    def feed(self, data: bytes) -> list[Framed]:
        """What ``data`` completes, in order (documents and errors, see ``Framed``)."""
        try:
            text = self._text + self._utf8.decode(data)
        except UnicodeDecodeError as exc:
            raise BadRequest(f"the stream is not UTF-8 ({exc.reason})") from None
        found: list[Framed] = []
        position = 0
        while True:
            if self._open:
                closed = self._frame(text)
                if closed is None:
                    break
                found.append(self._parsed(text, self._start, closed))
                self._open = False
                position = closed
                continue
            match = _NOT_WHITESPACE.search(text, position)
            if match is None:
                position = len(text)
                break
            position = match.start()
            if text[position] != "{":
                raise BadRequest(
                    f"expected a JSON object at character {self._consumed + position} of the "
                    f"stream, got {text[position : position + 20]!r}"
                )
            try:
                document, after = _DECODER.raw_decode(text, position)
            except (ValueError, RecursionError):
                # Not all here yet, or not JSON: frame it to tell which.
                self._open, self._start, self._scan = True, position, position + 1
                self._depth, self._in_string = 1, False
                continue
            found.append(self._sized(document, text, position, after))
            position = after
        keep = self._start if self._open else position
        self._text = text[keep:]
        self._consumed += keep
        self._start -= keep if self._open else 0
        self._scan -= keep if self._open else 0
        if self._open and len(self._text) > self._max:
            raise PayloadTooLarge(
                f"a record is longer than {self._max} bytes; the limit is {self._max} bytes"
            )
        return found

    def _frame(self, text: str) -> int | None:
        """Follow the open object's braces and strings; the index past its closing
        brace, or None if it has not all arrived (the state is kept to resume)."""
        position = self._scan
        end = len(text)
        while position < end:
            if self._in_string:
                match = _INSIDE.search(text, position)
                if match is None:
                    position = end
                    break
                position = match.start()
                if text[position] == "\\":
                    if position + 1 >= end:
                        break  # the escaped character has not arrived yet
                    position += 2
                else:
                    self._in_string = False
                    position += 1
                continue
            match = _OUTSIDE.search(text, position)
            if match is None:
                position = end
                break
            position = match.end()
            character = match.group()
            if character == '"':
                self._in_string = True
            elif character == "{":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    return position
        self._scan = position
        return None

    def _parsed(self, text: str, start: int, end: int) -> Framed:
        try:
            document = _DECODER.decode(text[start:end])
        except json.JSONDecodeError as exc:
            return BadRequest(
                f"record is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            )
        except RecursionError:
            return BadRequest("record is nested too deeply")
        except ValueError as exc:  # NaN, Infinity, an integer too long to convert
            return BadRequest(f"record is not valid JSON: {exc}")
        return self._sized(document, text, start, end)

    def _sized(self, document: object, text: str, start: int, end: int) -> Framed:
        # A character is 1 to 4 bytes: count the bytes only when it could matter.
        if (end - start) * 4 > self._max:
            size = len(text[start:end].encode("utf-8", "surrogatepass"))
            if size > self._max:
                return PayloadTooLarge(f"record is {size} bytes; the limit is {self._max} bytes")
        return document

    def finish(self) -> None:
        """The stream ended. Raises BadRequest if an object was left incomplete."""
        try:
            rest = self._utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            raise BadRequest("the stream ended inside a UTF-8 character") from None
        if self._open or (self._text + rest).strip():
            raise BadRequest("the stream ended inside a record (a JSON object left open)")


def split_body(body: bytes, *, max_record_bytes: int) -> list[object]:
    """Every record document of a complete body; raises the first record's error
    (SidecarError), and BadRequest, PayloadTooLarge as ``ObjectSplitter`` does."""
    splitter = ObjectSplitter(max_record_bytes)
    framed = splitter.feed(body)
    splitter.finish()
    for item in framed:
        if isinstance(item, SidecarError):
            raise item
    return framed


# Answers --------------------------------------------------------------------------------------


def http_status_of(code: int) -> int:
    """The HTTP status a v2 five-digit code stands for (40910 -> 409)."""
    return code // 100 if code >= 10000 else code


def error_body(exc: SidecarError) -> dict[str, object]:
    """``exc`` in v3's error shape, with the sidecar's extensions."""
    body: dict[str, object] = {
        "error_code": exc.http_status,
        "message": exc.message,
        "v2_error_code": exc.error_code,
    }
    if exc.retriable:
        body["retriable"] = True
    if isinstance(exc, FencedGeneration):
        if exc.current_generation >= 0:
            body["current_generation"] = exc.current_generation
        if exc.current_count >= 0:
            body["current_count"] = exc.current_count
    return body


def failed_body(failed: RecordFailed) -> dict[str, object]:
    """A record that was not written, in v3's error shape."""
    body: dict[str, object] = {
        "error_code": http_status_of(failed.error_code),
        "message": failed.message,
        "v2_error_code": failed.error_code,
    }
    if failed.error_code == 50002:  # Kafka did not answer: the same record may be sent again
        body["retriable"] = True
    return body


def written_body(
    written: RecordWritten, decoded: V3Record, *, cluster_id: str, topic: str
) -> dict[str, object]:
    """A record Kafka acknowledged, as REST Proxy v3 answers it."""
    body: dict[str, object] = {
        "error_code": 200,
        "cluster_id": cluster_id,
        "topic_name": topic,
        "partition_id": written.partition,
        "offset": written.offset,
        "timestamp": _iso_timestamp(written.timestamp_ms),
    }
    record = decoded.record
    if decoded.key_type is not None:
        body["key"] = {"type": decoded.key_type, "size": len(record.key or b"")}
    if decoded.value_type is not None:
        body["value"] = {"type": decoded.value_type, "size": len(record.value or b"")}
    return body


def _iso_timestamp(millis: int | None) -> str | None:
    if millis is None or millis < 0:
        return None
    second, milli = divmod(millis, 1000)
    global _last_second
    if _last_second[0] != second:
        # Records of one run mostly share their second: format it once.
        moment = datetime.fromtimestamp(second, tz=UTC)
        _last_second = (second, moment.strftime("%Y-%m-%dT%H:%M:%S."))
    return f"{_last_second[1]}{milli:03d}Z"


_last_second: tuple[int, str] = (-1, "")


def encode(body: dict[str, object]) -> bytes:
    """One answer as a line of UTF-8 JSON (a stream is these lines, concatenated)."""
    return _COMPACT.encode(body).encode("utf-8") + b"\n"


# Clusters -------------------------------------------------------------------------------------


def cluster_body(cluster_id: str, base_url: str) -> dict[str, object]:
    """One cluster as REST Proxy v3 lists it (the links this sidecar serves only)."""
    return {
        "kind": "KafkaCluster",
        "metadata": {
            "self": f"{base_url}/v3/clusters/{cluster_id}",
            "resource_name": f"crn:///kafka={cluster_id}",
        },
        "cluster_id": cluster_id,
    }


def cluster_list_body(cluster_id: str, base_url: str) -> dict[str, object]:
    return {
        "kind": "KafkaClusterList",
        "metadata": {"self": f"{base_url}/v3/clusters", "next": None},
        "data": [cluster_body(cluster_id, base_url)],
    }
