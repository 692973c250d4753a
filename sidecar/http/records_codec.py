"""The records response of a REST Proxy v2 consumer, as pure functions: what
``GET /consumers/{group}/instances/{name}/records`` answers, and the key hand-off
events and rebalance notices that come with the records (``encode_records_response``,
``records_content_type``), or alone (``encode_key_events``, a callback body).

This is the hot path of the consume side: a response is written as JSON text straight
from the records, without building a document first. The request side of the consumer
routes is ``consumer_codec`` and ``create_consumer_codec``.

* ``Accept``: the instance's own type, ``application/vnd.kafka.v2+json``,
  ``application/json`` and wildcards are answered in the instance's format (REST Proxy
  would serve the generic types as binary and fail a json instance); another embedded
  format is refused (REST Proxy: 406, code 40601).
* json records: empty bytes decode as ``null``, as Confluent's ``KafkaJsonDeserializer``
  does; bytes that are not JSON fail the read, naming topic, partition and offset, as the
  proxy's deserializer fails it. Delivering them as something else would hand the app a
  value it never wrote. The service encodes a batch before it counts it delivered, and
  the app can step past the record with ``POST positions`` or read with a binary
  consumer. Valid JSON is embedded byte for byte, so numbers keep their exact text.
* Record headers (base64 values, as in produce) are written only when a record has some,
  so a record without headers has exactly the REST Proxy v2 shape; which ones, the
  instance's ``record_headers`` says (``create_consumer_codec``).
* Rebalance notices, key hand-off events and records are written in the order given;
  the consumer routes give notices first, then events, then records (an event told
  with a partition's last records reaches the app before them). Events and notices are
  told apart by ``type``, which records never have.
"""

from __future__ import annotations

import binascii
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, NoReturn, TypeAlias, TypedDict

from sidecar.core import consume
from sidecar.core.errors import (
    InvalidRecord,
    NotAcceptable,
)
from sidecar.core.handoff import AssignmentChange, HandoffKind, TruncationNotice
from sidecar.core.placement import COUNT_HEADER, GENERATION_HEADER, SIDECAR_HEADER
from sidecar.core.produce import EmbeddedFormat
from sidecar.http.callback_codec import truncation_fields
from sidecar.http.produce_codec import (
    is_reserved_header,
)


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """One partition of one topic, as a request names it."""

    topic: str
    partition: int


def encode_response(body: object) -> bytes:
    """A response body as compact UTF-8 JSON, to send as ``V2_RESPONSE_CONTENT_TYPE``."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_EMBEDDED_MEDIA_TYPE: Final = re.compile(r"application/vnd\.kafka\.([a-z]+)\.v2\+json")
# Media ranges any consumer instance can answer, in its own format.
_GENERIC_ACCEPT: Final = frozenset(
    {"*/*", "application/*", "application/json", "application/vnd.kafka.v2+json"}
)


def records_media_type(fmt: EmbeddedFormat) -> str:
    """The media type of a records response in ``fmt``, e.g. binary's."""
    return f"application/vnd.kafka.{fmt.value}.v2+json"


class RecordHeaders(StrEnum):
    """Which record headers a records response carries (the ``record_headers`` option)."""

    ALL = "all"
    APP = "app"
    """The application's own: every header but the sidecar's ``ordered.*`` ones."""
    NONE = "none"


KeyEventType = HandoffKind
AssignmentNoticeType = AssignmentChange


RecordToDeliver: TypeAlias = consume.ConsumedRecord
"""What the records response needs of a record: the core's record shape (the service's
own record type has it, so a response is encoded without a copy of every record)."""


@dataclass(frozen=True, slots=True)
class KeyEvent:
    """A key hand-off event for the app; ``event_id`` is what it acknowledges."""

    type: KeyEventType
    topic: str
    partition: int
    generation: int
    event_id: int


@dataclass(frozen=True, slots=True)
class RebalanceNotice:
    """A rebalance told to the app, as a records response carries it (the core's
    ``AssignmentNotice``); nothing to acknowledge."""

    type: AssignmentNoticeType
    partitions: tuple[PartitionRef, ...]


class KeyEventEntry(TypedDict):
    type: str
    topic: str
    partition: int
    generation: int
    event_id: int


# Create ----------------------------------------------------------------------------------


def records_content_type(accept: str | None, fmt: EmbeddedFormat) -> str:
    """The content type to answer ``GET records`` with, given its ``Accept`` header.

    Raises NotAcceptable (406, 40601 as REST Proxy) when no acceptable media range fits
    the instance's format ``fmt``.
    """
    own = records_media_type(fmt)
    if accept is None or not accept.strip():
        return own
    ranges = []
    for media_range in accept.split(","):
        media_type, *parameters = (part.strip() for part in media_range.split(";"))
        ranges.append((media_type.lower(), _acceptable(parameters)))
    # RFC 9110 §12.5.1: the most specific range that fits decides, so the instance's
    # own type named with q=0 is refused even beside */*.
    named = [acceptable for media_type, acceptable in ranges if media_type == own]
    if named and not any(named):
        raise NotAcceptable(f"Accept {accept!r} does not include {own}")
    asked: list[str] = []
    for media_type, acceptable in ranges:
        if not media_type or not acceptable:
            continue
        if media_type == own or media_type in _GENERIC_ACCEPT:
            return own
        asked.append(media_type)
    formats = [m.group(1) for m in map(_EMBEDDED_MEDIA_TYPE.fullmatch, asked) if m is not None]
    if formats:
        raise NotAcceptable(
            f"Accept asks for {' or '.join(formats)} records but this consumer instance was "
            f"created with format {fmt.value}; accept {own}"
        )
    raise NotAcceptable(f"Accept {accept!r} does not include {own}")


def _acceptable(parameters: Sequence[str]) -> bool:
    # RFC 9110 §12.4.2: q=0 means "not acceptable"; an unreadable weight is read the same.
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value.strip()) > 0  # NaN is not > 0 either
            except ValueError:
                return False
    return True


def encode_records_response(
    items: Sequence[RecordToDeliver | KeyEvent | RebalanceNotice | TruncationNotice],
    fmt: EmbeddedFormat,
    record_headers: RecordHeaders = RecordHeaders.APP,
) -> bytes:
    """The ``GET records`` body: a JSON array of records (and events) in order.

    Records are ``{"topic", "key", "value", "partition", "offset", "headers"?}``, keys
    and values base64 (binary) or embedded JSON (json); ``headers`` holds the ones
    ``record_headers`` keeps and is left out when none are. Notices and key events are
    objects with a ``type``, which records never have. Raises InvalidRecord when
    ``fmt`` is json and a key or value is not JSON; the message names the record.
    """
    # The mode is resolved once a response, not tested once a header (reading an enum
    # member costs ~0.2 µs): in-process, 2.9 -> 2.3 µs a record for "app" and 4.3 -> 3.6
    # for "all" (managed records of 100 B, best of 18 runs).
    header_entries = _HEADER_ENTRIES[record_headers]
    entries = (
        _event_json(item)
        if isinstance(item, KeyEvent)
        else _notice_json(item)
        if isinstance(item, RebalanceNotice)
        else _truncation_json(item)
        if isinstance(item, TruncationNotice)
        else _record_entry(item, fmt, header_entries)
        for item in items
    )
    return f"[{','.join(entries)}]".encode()


def _record_entry(
    record: RecordToDeliver,
    fmt: EmbeddedFormat,
    header_entries: _HeaderEntries | None,
) -> str:
    key = _embed(record.key, fmt, record, "key")
    value = _embed(record.value, fmt, record, "value")
    headers = ""
    if record.headers and header_entries is not None:
        entries = header_entries(record.headers)
        if entries:
            headers = ',"headers":[' + ",".join(entries) + "]"
    return (
        f'{{"topic":{_json_string(record.topic)},"key":{key},"value":{value},'
        f'"partition":{record.partition},"offset":{record.offset}{headers}}}'
    )


@functools.lru_cache(maxsize=4096)
def _json_string(text: str) -> str:
    # Topic names repeat on every record of a response.
    return json.dumps(text)


_REPEATING_HEADERS: Final = frozenset({GENERATION_HEADER, COUNT_HEADER, SIDECAR_HEADER})
"""Headers of a managed topic's records whose values repeat from record to record (the
sequence header does not): their whole JSON entry is kept."""


_HeaderEntries: TypeAlias = Callable[[Sequence[tuple[str, bytes | None]]], list[str]]
"""A record's headers to the JSON entries a response keeps of them."""


def _all_header_entries(headers: Sequence[tuple[str, bytes | None]]) -> list[str]:
    return [_header_entry(name, data) for name, data in headers]


def _app_header_entries(headers: Sequence[tuple[str, bytes | None]]) -> list[str]:
    # The names produce refuses: an app cannot write one through the sidecar, so whatever
    # carries the prefix came from the sidecar (or bypassed it).
    return [_header_entry(name, data) for name, data in headers if not is_reserved_header(name)]


_HEADER_ENTRIES: Final[Mapping[RecordHeaders, _HeaderEntries | None]] = {
    RecordHeaders.ALL: _all_header_entries,
    RecordHeaders.APP: _app_header_entries,
    RecordHeaders.NONE: None,
}


def _header_entry(name: str, data: bytes | None) -> str:
    if name in _REPEATING_HEADERS:
        return _repeating_header(name, data)
    return _header_start(name) + _base64_or_null(data) + "}"


@functools.lru_cache(maxsize=1024)
def _repeating_header(name: str, data: bytes | None) -> str:
    return _header_start(name) + _base64_or_null(data) + "}"


@functools.lru_cache(maxsize=4096)
def _header_start(name: str) -> str:
    # A managed topic's records carry the same header names every time.
    return f'{{"name":{json.dumps(name)},"value":'


def _embed(data: bytes | None, fmt: EmbeddedFormat, record: RecordToDeliver, field: str) -> str:
    if fmt is EmbeddedFormat.BINARY:
        return _base64_or_null(data)
    # KafkaJsonDeserializer reads no bytes and empty bytes alike as null.
    if not data:
        return "null"
    where = f"record {record.topic}-{record.partition} offset {record.offset}: {field}"
    try:
        text = data.decode("utf-8")
        # Only validated, never converted: the text is embedded as it is, so that numbers
        # keep their exact digits (Python would turn 1e400 into inf and refuse 5000 digits).
        json.loads(text, parse_constant=_not_json, parse_int=_ignore, parse_float=_ignore)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidRecord(
            f"{where} is not JSON ({reason}); read it with a binary consumer, or seek past it"
        ) from None
    return text.strip(" \t\r\n")


def _not_json(name: str) -> NoReturn:
    # Python's json accepts NaN and Infinity; JSON does not, nor will the app's parser.
    raise ValueError(f"{name} is not a JSON value")


def _ignore(text: str) -> None:
    return None


def _base64_or_null(data: bytes | None) -> str:
    # binascii directly: base64.b64encode's wrapper costs as much as the encoding.
    return "null" if data is None else '"' + binascii.b2a_base64(data, newline=False).decode() + '"'


# Offsets and positions -------------------------------------------------------------------


def key_events_body(events: Sequence[KeyEvent]) -> list[KeyEventEntry]:
    """Key hand-off events as JSON objects, in order."""
    return [_event_entry(event) for event in events]


def encode_key_events(events: Sequence[KeyEvent]) -> bytes:
    """``key_events_body`` as a UTF-8 JSON array."""
    return encode_response(key_events_body(events))


def _event_entry(event: KeyEvent) -> KeyEventEntry:
    return {
        "type": event.type.value,
        "topic": event.topic,
        "partition": event.partition,
        "generation": event.generation,
        "event_id": event.event_id,
    }


def _event_json(event: KeyEvent) -> str:
    return json.dumps(_event_entry(event), separators=(",", ":"))


def _truncation_json(notice: TruncationNotice) -> str:
    entry = {"type": notice.kind.value} | truncation_fields(notice)
    return json.dumps(entry, separators=(",", ":"))


def _notice_json(notice: RebalanceNotice) -> str:
    entry = {
        "type": notice.type.value,
        "partitions": [{"topic": p.topic, "partition": p.partition} for p in notice.partitions],
    }
    return json.dumps(entry, separators=(",", ":"))
