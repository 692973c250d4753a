"""Confluent REST Proxy v2 consumer requests, as pure functions.

The requests of a consumer instance are decoded here, the creation request in
``create_consumer_codec``. The response bodies are ``consumer_response_codec``'s, except
the records response, the hot path, which is ``records_codec``'s.

Routes under ``/consumers/{group}``, ``{instance}`` standing for
``/consumers/{group}/instances/{name}``:

=======================================  =============================  ============================
route                                    decoder                        response body
=======================================  =============================  ============================
``POST /consumers/{group}``              ``decode_create_consumer``     ``create_consumer_body``
``POST {instance}/subscription``         ``decode_subscription``        none (204)
``GET {instance}/subscription``          none                           ``subscription_body``
``DELETE {instance}/subscription``       none                           none (204)
``POST {instance}/assignments``          ``decode_assignments``         none (204)
``GET {instance}/assignments``           none                           ``assignments_body``
``GET {instance}/records``               ``decode_records_query``,      ``encode_records_response``
                                         ``records_content_type``       (both in ``records_codec``)
``POST {instance}/offsets``              ``decode_commit_offsets``      none (204)
``GET {instance}/offsets``               ``decode_committed_request``   ``committed_offsets_body``
``POST {instance}/positions``            ``decode_seek``                none (204)
``POST {instance}/positions/beginning``  ``decode_seek_partitions``     none (204)
``POST {instance}/positions/end``        ``decode_seek_partitions``     none (204)
``POST {instance}/events/ack``           ``decode_event_ack``           none (204)
=======================================  =============================  ============================

Request bodies carry no embedded data, so every consumer route takes the same content
types, as REST Proxy's ``@Consumes`` does: ``application/vnd.kafka.v2+json``, any
``application/vnd.kafka.<format>.v2+json`` and ``application/json``. A request without a
body may leave Content-Type out. The check is not pedantry: a web page can make a browser
send a cross-origin form or ``text/plain`` POST to localhost without a CORS preflight,
and requiring a JSON type stops it from seeking or committing the application's consumer.
Unknown fields are refused everywhere, so a misspelt field is an error, not a default.

Where REST Proxy is lenient or silent, this codec chooses (the creation request's
choices are ``create_consumer_codec``'s):

* Topic and instance names follow ``sidecar.core.names`` (an instance name: 1-255
  URL-unreserved characters, not ``.`` or ``..``): a name that reads the same in every
  client, and that the sidecar can store.
* Commits name the offset of the last *processed* record and Kafka stores ``offset + 1``
  (``OffsetToCommit.next_offset``), exactly as REST Proxy v2; ``GET offsets`` answers
  Kafka's stored offset (the next to read), as the proxy does. No body, an empty body,
  ``null`` or ``{}`` commits everything delivered; ``{"offsets": []}`` commits nothing
  (the proxy commits an empty map), because turning it into "commit all" would commit
  records the application has not processed.
* Empty lists are accepted where Kafka gives them a meaning (assign none, seek none),
  except ``topics``: subscribing to nothing is Kafka's unsubscribe, which is ``DELETE``.
  A partition (or topic, or event id) named twice in one request is refused: for
  offsets the two entries could disagree, and elsewhere it is a client bug.
* ``timeout`` and ``max_bytes`` follow the proxy: absent or at most 0 means the default,
  larger values are capped at the limit (an existing client asks for long polls and gets
  the server's cap, not an error). Query parameters this codec does not know are ignored,
  as JAX-RS ignores them (a client may add a cache-busting parameter).
* ``Accept`` on ``records``, json records and record headers: see ``records_codec``.

Extensions of this project (those of the creation request: ``create_consumer_codec``):

* Key hand-off events: ``{"type": "keys_revoked" | "keys_assigned", "topic", "partition",
  "generation", "event_id"}``. In a records response they sit among the records in
  delivery order (an event before the records it must precede) and are told apart by
  ``type``, which records never have; ``encode_key_events`` writes a list of them alone
  (e.g. a callback body). Event ids are integers; the app acknowledges with
  ``{"event_ids": [...]}``.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias, TypeVar

from sidecar.core import names
from sidecar.core.errors import (
    BadRequest,
    UnsupportedMediaType,
)

# Shared with the produce codec, so that both answer a malformed body in the same words.
from sidecar.http.json_body import json_type, parse_json, refuse_unknown_fields
from sidecar.http.produce_codec import (
    MAX_PARTITION,
)
from sidecar.http.records_codec import PartitionRef

MAX_OFFSET: Final = 2**63 - 1
"""Kafka offsets are int64."""
MAX_TOPIC_PATTERN_LENGTH: Final = 1024
MAX_EVENT_ID: Final = 2**63 - 1

_SUBSCRIPTION_FIELDS: Final = frozenset({"topics", "topic_pattern"})
_PARTITION_FIELDS: Final = frozenset({"topic", "partition"})
_OFFSET_FIELDS: Final = frozenset({"topic", "partition", "offset", "metadata"})
_TIMESTAMP_FIELDS: Final = frozenset({"topic", "partition", "timestamp", "metadata"})

SIGNED_DECIMAL: Final = re.compile(r"-?[0-9]{1,19}")
_MIN_INT64: Final = -(2**63)
_MAX_INT64: Final = 2**63 - 1
_UTF8_CHARSETS: Final = frozenset({"utf-8", "utf8"})
_REQUEST_MEDIA_TYPES: Final = frozenset(
    {
        "application/json",
        "application/vnd.kafka.v2+json",
        *(
            f"application/vnd.kafka.{name}.v2+json"
            for name in ("binary", "json", "avro", "protobuf", "jsonschema")
        ),
    }
)
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MILLISECOND: Final = datetime.timedelta(milliseconds=1)

_Item = TypeVar("_Item")


@dataclass(frozen=True, slots=True)
class SubscribeTopics:
    """Subscribe to these topics (at least one, each named once)."""

    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SubscribePattern:
    """Subscribe to every topic whose whole name matches ``pattern`` (a Python regex)."""

    pattern: str


Subscription: TypeAlias = SubscribeTopics | SubscribePattern


@dataclass(frozen=True, slots=True)
class OffsetToCommit:
    """``offset`` is the last record the app processed, as in REST Proxy v2."""

    topic: str
    partition: int
    offset: int
    metadata: str | None

    @property
    def next_offset(self) -> int:
        """What Kafka stores as the group's committed offset: the next record to read."""
        return self.offset + 1


@dataclass(frozen=True, slots=True)
class SeekOffset:
    """Read ``partition`` next from ``offset``."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class SeekTimestamp:
    """Read ``partition`` next from its first record at or after ``timestamp_ms``."""

    topic: str
    partition: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class SeekRequest:
    """A validated ``POST positions``; no partition appears twice across both lists."""

    offsets: tuple[SeekOffset, ...]
    timestamps: tuple[SeekTimestamp, ...]


@dataclass(frozen=True, slots=True)
class RecordsQuery:
    """``GET records`` parameters with the defaults and caps already applied."""

    timeout_ms: int
    max_bytes: int


# Subscription and assignment -------------------------------------------------------------


def decode_subscription(body: bytes, *, content_type: str | None) -> Subscription:
    """Validate ``POST subscription``: exactly one of ``topics`` and ``topic_pattern``.

    Raises UnsupportedMediaType (content type) or BadRequest (shape, a topic name Kafka
    refuses, a topic named twice, a pattern that is not a Python regex).
    """
    document = _parse_object(body, content_type)
    refuse_unknown_fields(document, _SUBSCRIPTION_FIELDS, "request", BadRequest)
    topics = document.get("topics")
    pattern = document.get("topic_pattern")
    if (topics is None) == (pattern is None):
        raise BadRequest("send exactly one of topics and topic_pattern")
    if pattern is not None:
        return SubscribePattern(_decode_pattern(pattern))
    raw_topics = _list_field(topics, "topics")
    if not raw_topics:
        raise BadRequest("topics is empty; DELETE the subscription to unsubscribe")
    names = tuple(_decode_topic(raw, f"topics[{i}]") for i, raw in enumerate(raw_topics))
    _refuse_repeats(names, "topics", repr)
    return SubscribeTopics(names)


def _decode_pattern(raw: object) -> str:
    if not isinstance(raw, str):
        raise BadRequest(f"topic_pattern must be a string, got {json_type(raw)}")
    if not 1 <= len(raw) <= MAX_TOPIC_PATTERN_LENGTH:
        raise BadRequest(
            f"topic_pattern must be 1 to {MAX_TOPIC_PATTERN_LENGTH} characters, got {len(raw)}"
        )
    try:
        re.compile(raw)
    except (re.error, RecursionError, OverflowError) as exc:
        raise BadRequest(
            f"topic_pattern {raw!r} is not a valid regular expression: {exc}"
        ) from None
    return raw


def decode_assignments(body: bytes, *, content_type: str | None) -> tuple[PartitionRef, ...]:
    """Validate ``POST assignments`` ``{"partitions": [...]}``; an empty list assigns none.

    Raises UnsupportedMediaType or BadRequest (shape, topic, partition, a repeat).
    """
    return _partitions_document(body, content_type)


# Records ---------------------------------------------------------------------------------


def decode_records_query(
    query: Mapping[str, str], *, default_timeout_ms: int, max_bytes_limit: int
) -> RecordsQuery:
    """``GET records`` ``timeout`` (ms) and ``max_bytes``, as REST Proxy reads them.

    Absent or at most 0 means ``default_timeout_ms`` / ``max_bytes_limit``; larger values
    are capped at them. ``query`` may be a multidict; a parameter repeated with different
    values is refused. Raises BadRequest for a value that is not a decimal integer.
    """
    timeout = _query_int(query, "timeout")
    max_bytes = _query_int(query, "max_bytes")
    return RecordsQuery(
        timeout_ms=(
            default_timeout_ms
            if timeout is None or timeout <= 0
            else min(timeout, default_timeout_ms)
        ),
        max_bytes=(
            max_bytes_limit
            if max_bytes is None or max_bytes <= 0
            else min(max_bytes, max_bytes_limit)
        ),
    )


def _query_int(query: Mapping[str, str], name: str) -> int | None:
    values = {value.strip() for key, value in query.items() if key == name}
    if len(values) > 1:
        raise BadRequest(f"query parameter {name} is sent more than once with different values")
    if not values:
        return None
    raw = values.pop()
    # int() alone would also take "+5", "1_000" and non-ASCII digits.
    if SIGNED_DECIMAL.fullmatch(raw) is None or not _MIN_INT64 <= int(raw) <= _MAX_INT64:
        unit = " (milliseconds)" if name == "timeout" else ""
        raise BadRequest(f"query parameter {name} must be a decimal integer{unit}, got {raw!r}")
    return int(raw)


def decode_commit_offsets(
    body: bytes, *, content_type: str | None
) -> tuple[OffsetToCommit, ...] | None:
    """Validate ``POST offsets``; None means "commit everything delivered".

    Raises UnsupportedMediaType or BadRequest (shape, topic, partition, offset, metadata,
    a partition named twice).
    """
    document = parse_optional_object(body, content_type)
    if document is None:
        return None
    refuse_unknown_fields(document, frozenset({"offsets"}), "request", BadRequest)
    if document.get("offsets") is None:
        return None
    raw_offsets = _list_field(document["offsets"], "offsets")
    offsets = tuple(
        _decode_offset_to_commit(raw, f"offsets[{i}]") for i, raw in enumerate(raw_offsets)
    )
    _refuse_repeats(offsets, "offsets", _partition_name)
    return offsets


def _decode_offset_to_commit(raw: object, where: str) -> OffsetToCommit:
    entry = _object_entry(raw, where, _OFFSET_FIELDS)
    # Kafka stores offset + 1, which must still be an int64.
    offset = _required_int(entry, "offset", where, 0, MAX_OFFSET - 1)
    metadata = entry.get("metadata")
    if metadata is not None and not isinstance(metadata, str):
        raise BadRequest(f"{where}.metadata must be a string, got {json_type(metadata)}")
    return OffsetToCommit(
        topic=_decode_topic(entry.get("topic"), f"{where}.topic"),
        partition=_required_int(entry, "partition", where, 0, MAX_PARTITION),
        offset=offset,
        metadata=metadata,
    )


def decode_committed_request(body: bytes, *, content_type: str | None) -> tuple[PartitionRef, ...]:
    """Validate the body of ``GET offsets``: ``{"partitions": [...]}``.

    Raises UnsupportedMediaType or BadRequest (no body, shape, topic, partition, a repeat).
    """
    return _partitions_document(body, content_type)


def decode_seek(body: bytes, *, content_type: str | None) -> SeekRequest:
    """Validate ``POST positions``: ``{"offsets": [...]}`` and/or ``{"timestamps": [...]}``.

    A ``metadata`` the proxy allows in each entry is accepted and dropped (a seek stores
    nothing). Timestamps are ISO-8601 strings with a time zone. Raises
    UnsupportedMediaType or BadRequest (shape, topic, partition, offset, timestamp, a
    partition named twice across both lists).
    """
    document = _parse_object(body, content_type)
    refuse_unknown_fields(document, frozenset({"offsets", "timestamps"}), "request", BadRequest)
    raw_offsets = _optional_list(document, "offsets")
    raw_timestamps = _optional_list(document, "timestamps")
    if raw_offsets is None and raw_timestamps is None:
        raise BadRequest("offsets is missing")
    offsets = tuple(
        _decode_seek_offset(raw, f"offsets[{i}]") for i, raw in enumerate(raw_offsets or [])
    )
    timestamps = tuple(
        _decode_seek_timestamp(raw, f"timestamps[{i}]")
        for i, raw in enumerate(raw_timestamps or [])
    )
    positions: tuple[SeekOffset | SeekTimestamp, ...] = (*offsets, *timestamps)
    _refuse_repeats(positions, "offsets and timestamps", _partition_name)
    return SeekRequest(offsets=offsets, timestamps=timestamps)


def _decode_seek_offset(raw: object, where: str) -> SeekOffset:
    entry = _object_entry(raw, where, _OFFSET_FIELDS)
    return SeekOffset(
        topic=_decode_topic(entry.get("topic"), f"{where}.topic"),
        partition=_required_int(entry, "partition", where, 0, MAX_PARTITION),
        offset=_required_int(entry, "offset", where, 0, MAX_OFFSET),
    )


def _decode_seek_timestamp(raw: object, where: str) -> SeekTimestamp:
    entry = _object_entry(raw, where, _TIMESTAMP_FIELDS)
    return SeekTimestamp(
        topic=_decode_topic(entry.get("topic"), f"{where}.topic"),
        partition=_required_int(entry, "partition", where, 0, MAX_PARTITION),
        timestamp_ms=_decode_timestamp(entry.get("timestamp"), f"{where}.timestamp"),
    )


def _decode_timestamp(raw: object, where: str) -> int:
    problem = f"{where} must be an ISO-8601 date-time with a time zone, from 1970, got {raw!r}"
    if not isinstance(raw, str):
        raise BadRequest(problem)
    try:
        moment = datetime.datetime.fromisoformat(raw)
    except ValueError:
        raise BadRequest(problem) from None
    # A moment without a zone would be read in the sidecar's zone, not the app's.
    if moment.tzinfo is None or moment < _EPOCH:
        raise BadRequest(problem)
    return (moment - _EPOCH) // _MILLISECOND


def decode_seek_partitions(body: bytes, *, content_type: str | None) -> tuple[PartitionRef, ...]:
    """Validate ``POST positions/beginning`` or ``/end``: ``{"partitions": [...]}``.

    Raises UnsupportedMediaType or BadRequest (shape, topic, partition, a repeat).
    """
    return _partitions_document(body, content_type)


# Key hand-off events ---------------------------------------------------------------------


def decode_event_ack(body: bytes, *, content_type: str | None) -> tuple[int, ...]:
    """Validate ``POST events/ack`` ``{"event_ids": [...]}``: the events the app finished.

    Raises UnsupportedMediaType or BadRequest (shape, an id that is not an integer from
    0 to ``MAX_EVENT_ID``, an id sent twice).
    """
    document = _parse_object(body, content_type)
    refuse_unknown_fields(document, frozenset({"event_ids"}), "request", BadRequest)
    raw_ids = _list_field(document.get("event_ids"), "event_ids")
    event_ids = tuple(
        int_in_range(raw, f"event_ids[{i}]", 0, MAX_EVENT_ID) for i, raw in enumerate(raw_ids)
    )
    _refuse_repeats(event_ids, "event_ids", str)
    return event_ids


# Shared ----------------------------------------------------------------------------------


def _check_content_type(content_type: str | None, has_body: bool) -> None:
    if content_type is None or not content_type.strip():
        if has_body:
            raise UnsupportedMediaType("Content-Type is missing; use application/vnd.kafka.v2+json")
        return
    media_type, *parameters = (part.strip() for part in content_type.split(";"))
    media_type = media_type.lower()
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in _UTF8_CHARSETS:
            raise UnsupportedMediaType(f"charset {charset!r} is not supported; JSON is UTF-8")
    if media_type not in _REQUEST_MEDIA_TYPES:
        raise UnsupportedMediaType(
            f"content type {media_type!r} is not supported; use application/vnd.kafka.v2+json"
        )


def _parse_object(body: bytes, content_type: str | None) -> dict[str, object]:
    document = parse_optional_object(body, content_type)
    if document is None:
        raise BadRequest("request body is missing; send a JSON object")
    return document


def parse_optional_object(body: bytes, content_type: str | None) -> dict[str, object] | None:
    """The body's JSON object, or None for no body, an empty one or ``null``.

    Raises UnsupportedMediaType (content type) or BadRequest (not JSON, not an object).
    """
    has_body = bool(body.strip())
    _check_content_type(content_type, has_body=has_body)
    if not has_body:
        return None
    document = parse_json(body)
    if document is None:
        return None
    if not isinstance(document, dict):
        raise BadRequest(f"request body must be a JSON object, got {json_type(document)}")
    return document


def _partitions_document(body: bytes, content_type: str | None) -> tuple[PartitionRef, ...]:
    document = _parse_object(body, content_type)
    refuse_unknown_fields(document, frozenset({"partitions"}), "request", BadRequest)
    raw_partitions = _list_field(document.get("partitions"), "partitions")
    refs = tuple(
        _decode_partition_ref(raw, f"partitions[{i}]") for i, raw in enumerate(raw_partitions)
    )
    _refuse_repeats(refs, "partitions", _partition_name)
    return refs


def _decode_partition_ref(raw: object, where: str) -> PartitionRef:
    entry = _object_entry(raw, where, _PARTITION_FIELDS)
    return PartitionRef(
        topic=_decode_topic(entry.get("topic"), f"{where}.topic"),
        partition=_required_int(entry, "partition", where, 0, MAX_PARTITION),
    )


def _object_entry(raw: object, where: str, known: frozenset[str]) -> dict[str, object]:
    if not isinstance(raw, dict):
        raise BadRequest(f"{where} must be a JSON object, got {json_type(raw)}")
    refuse_unknown_fields(raw, known, where, BadRequest)
    return raw


def _list_field(raw: object, field: str) -> list[object]:
    if raw is None:
        raise BadRequest(f"{field} is missing")
    if not isinstance(raw, list):
        raise BadRequest(f"{field} must be an array, got {json_type(raw)}")
    return raw


def _optional_list(document: Mapping[str, object], field: str) -> list[object] | None:
    raw = document.get(field)
    return None if raw is None else _list_field(raw, field)


def _decode_topic(raw: object, where: str) -> str:
    if not isinstance(raw, str):
        raise BadRequest(
            f"{where} is missing"
            if raw is None
            else f"{where} must be a string, got {json_type(raw)}"
        )
    return names.topic_name(raw, where)


def _required_int(entry: Mapping[str, object], field: str, where: str, low: int, high: int) -> int:
    raw = entry.get(field)
    if raw is None:
        raise BadRequest(f"{where}.{field} is missing")
    return int_in_range(raw, f"{where}.{field}", low, high)


def int_in_range(raw: object, where: str, low: int, high: int) -> int:
    """``raw`` if it is an integer from ``low`` to ``high``; raises BadRequest (``where``)."""
    # bool is an int in Python but true is not a number.
    if not isinstance(raw, int) or isinstance(raw, bool) or not low <= raw <= high:
        raise BadRequest(f"{where} must be an integer from {low} to {high}, got {raw!r}")
    return raw


class _OnePartition(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...


def _partition_name(item: _OnePartition) -> str:
    return f"{item.topic}-{item.partition}"


def _refuse_repeats(items: Sequence[_Item], field: str, name: Callable[[_Item], str]) -> None:
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        key = name(item)
        if key in first:
            raise BadRequest(f"{field} names {key} twice (entries {first[key]} and {index})")
        first[key] = index
