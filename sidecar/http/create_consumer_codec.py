"""The consumer creation request of REST Proxy v2, ``POST /consumers/{group}``, as a pure
function (``decode_create_consumer``). The rules every consumer request follows (content
types, unknown fields, names) are ``consumer_codec``'s.

Where REST Proxy is lenient or silent, this codec chooses:

* ``format`` is matched without case (as the proxy does); avro, protobuf and jsonschema
  need a schema registry this sidecar does not use and are refused as an invalid consumer
  configuration (422 in REST Proxy), not as an unsupported media type: the request's
  content type is fine, one of its values is not.
* ``fetch.min.bytes`` and ``consumer.request.timeout.ms`` are a JSON integer or a decimal
  string (Jackson coerces strings to Integer; it also truncates fractions, which is refused
  here). ``fetch.min.bytes`` -1 is the proxy's "disabled" and decodes as None.
  ``auto.commit.enable`` is ``"true"``/``"false"`` in any case (Kafka's boolean parsing)
  or a JSON boolean; ``auto.offset.reset`` is matched without case, as Kafka does.
* The deprecated aliases the proxy still reads (``id`` for ``name``, ``responseMinBytes``,
  ``requestWaitMs``) are accepted; an alias and its field with different values are refused.

Extensions of this project:

* ``callback_url`` / ``callback_timeout_ms`` on create: the URL the sidecar POSTs key
  hand-off events to and how long it waits for a 2xx (DESIGN §6). Callbacks are loopback
  only: the URL must be http(s) to a loopback host (127.0.0.0/8, ::1 or ``localhost``),
  the sidecar's own application; otherwise anyone who can reach the sidecar could make
  it send requests into the network it runs in. No setting allows other hosts.
  Credentials in the URL are refused (they would end up in logs).
* ``assignment_events: true`` on create (JSON boolean): rebalances are told too, as
  ``{"type": "partitions_revoked" | "partitions_assigned", "partitions": [{"topic",
  "partition"}, ...]}``, first in the next records response (or POSTed to the callback
  URL). They have no ``event_id``: nothing waits for them to be acknowledged.
* ``record_headers`` on create: which record headers a records response carries.
  ``"app"`` (the default) keeps the application's own headers and leaves out the
  sidecar's ``ordered.*`` ones; ``"all"`` writes every header, so a consumer can see the
  generation and count a record was routed with; ``"none"`` writes no headers, which is
  REST Proxy v2's own record shape. The default is the app's own headers because the
  sidecar's are not what the app wrote: they are the sidecar's wire format between its
  own processes (it changed once, from four headers to the stamp), and on small records
  they are a good part of a response (the stamp's entry is some 75 bytes against a
  100-byte value's 136 of base64), which an app reading them pays to parse. The audit is
  not affected: it records a delivery from the record the sidecar read, not from the
  response.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final
from urllib.parse import urlsplit

from sidecar.core import names
from sidecar.core.errors import BadRequest, InvalidConsumerConfig
from sidecar.core.produce import EmbeddedFormat
from sidecar.http.consumer_codec import SIGNED_DECIMAL, int_in_range, parse_optional_object
from sidecar.http.json_body import json_type, refuse_unknown_fields
from sidecar.http.records_codec import RecordHeaders

MAX_FETCH_MIN_BYTES: Final = 10_000_000
"""REST Proxy's own bound for ``fetch.min.bytes``."""
MAX_REQUEST_TIMEOUT_MS: Final = 2**31 - 1
"""``consumer.request.timeout.ms`` is a Java int in REST Proxy."""
MAX_CALLBACK_TIMEOUT_MS: Final = 600_000
MAX_CALLBACK_URL_LENGTH: Final = 2048

_CREATE_FIELDS: Final = frozenset(
    {
        "name",
        "format",
        "auto.offset.reset",
        "auto.commit.enable",
        "fetch.min.bytes",
        "consumer.request.timeout.ms",
        "callback_url",
        "callback_timeout_ms",
        "assignment_events",
        "record_headers",
    }
)
# Deprecated spellings REST Proxy v2 still reads (JsonAlias / the v1 "id").
_CREATE_ALIASES: Final[Mapping[str, str]] = {
    "id": "name",
    "responseMinBytes": "fetch.min.bytes",
    "requestWaitMs": "consumer.request.timeout.ms",
}
_CREATE_KNOWN_FIELDS: Final = _CREATE_FIELDS | frozenset(_CREATE_ALIASES)

_VISIBLE_ASCII: Final = re.compile(r"[\x21-\x7e]+")
_BOOLEANS: Final[Mapping[str, bool]] = {"true": True, "false": False}
_SCHEMA_FORMATS: Final = frozenset({"avro", "protobuf", "jsonschema"})
_IPV6_LOOPBACK: Final = ipaddress.IPv6Address("::1")


class AutoOffsetReset(StrEnum):
    """Where a consumer starts in a partition its group has no committed offset for."""

    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"


# The hand-off kinds are the core's; the wire names are their values.
@dataclass(frozen=True, slots=True)
class CreateConsumerRequest:
    """A validated ``POST /consumers/{group}``; None means "the sidecar's default"."""

    name: str | None
    """None: the service generates one (it must match the instance name rule too)."""
    format: EmbeddedFormat
    auto_offset_reset: AutoOffsetReset | None
    auto_commit: bool | None
    fetch_min_bytes: int | None
    request_timeout_ms: int | None
    callback_url: str | None
    callback_timeout_ms: int | None
    assignment_events: bool = False
    record_headers: RecordHeaders = RecordHeaders.APP


def decode_create_consumer(
    body: bytes, *, content_type: str | None, allow_remote_callbacks: bool = False
) -> CreateConsumerRequest:
    """Validate ``POST /consumers/{group}``; no body creates a binary consumer.

    Raises UnsupportedMediaType (content type) or BadRequest (not JSON, wrong shape, a
    value out of range or not servable, a callback URL that is not loopback).
    ``allow_remote_callbacks`` exists for tests of the URL's other rules on non-loopback
    hosts; the sidecar never sets it (callbacks are loopback only).
    """
    document = parse_optional_object(body, content_type) or {}
    refuse_unknown_fields(document, _CREATE_KNOWN_FIELDS, "request", BadRequest)
    fields = _resolve_aliases(document)
    callback_url = _decode_callback_url(fields.get("callback_url"), allow_remote_callbacks)
    callback_timeout_ms = _strict_int(
        fields.get("callback_timeout_ms"), "callback_timeout_ms", 1, MAX_CALLBACK_TIMEOUT_MS
    )
    if callback_timeout_ms is not None and callback_url is None:
        raise BadRequest("callback_timeout_ms is set without callback_url")
    fetch_min_bytes = _config_int(
        fields.get("fetch.min.bytes"), "fetch.min.bytes", -1, MAX_FETCH_MIN_BYTES
    )
    return CreateConsumerRequest(
        name=_decode_instance_name(fields.get("name")),
        format=_decode_format(fields.get("format")),
        auto_offset_reset=_decode_offset_reset(fields.get("auto.offset.reset")),
        auto_commit=_decode_auto_commit(fields.get("auto.commit.enable")),
        fetch_min_bytes=None if fetch_min_bytes == -1 else fetch_min_bytes,
        request_timeout_ms=_config_int(
            fields.get("consumer.request.timeout.ms"),
            "consumer.request.timeout.ms",
            0,
            MAX_REQUEST_TIMEOUT_MS,
        ),
        callback_url=callback_url,
        callback_timeout_ms=callback_timeout_ms,
        assignment_events=_strict_bool(fields.get("assignment_events"), "assignment_events"),
        record_headers=_decode_record_headers(fields.get("record_headers")),
    )


def _strict_bool(raw: object, field: str) -> bool:
    """An extension's boolean: JSON true or false only (None: absent, false)."""
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise BadRequest(f"{field} must be true or false, got {raw!r}")
    return raw


def _resolve_aliases(document: Mapping[str, object]) -> dict[str, object]:
    fields = {name: value for name, value in document.items() if value is not None}
    for alias, field in _CREATE_ALIASES.items():
        if alias not in fields:
            continue
        value = fields.pop(alias)
        if field in fields and fields[field] != value:
            raise BadRequest(
                f"{alias} {value!r} conflicts with {field} {fields[field]!r}; "
                f"{alias} is a deprecated spelling of {field}, send only {field}"
            )
        fields[field] = value
    return fields


def _decode_instance_name(raw: object) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise BadRequest(f"name must be a string, got {json_type(raw)}")
    return names.instance_name(raw, "name")


def _decode_format(raw: object) -> EmbeddedFormat:
    if raw is None:
        return EmbeddedFormat.BINARY
    if not isinstance(raw, str):
        raise BadRequest(f"format must be a string, got {json_type(raw)}")
    name = raw.lower()
    if name in _SCHEMA_FORMATS:
        raise InvalidConsumerConfig(
            f"format {raw!r} needs a schema registry, which this sidecar does not use; "
            "use binary or json"
        )
    try:
        return EmbeddedFormat(name)
    except ValueError:
        raise InvalidConsumerConfig(f"format must be binary or json, got {raw!r}") from None


def _decode_record_headers(raw: object) -> RecordHeaders:
    if raw is None:
        return RecordHeaders.APP
    if not isinstance(raw, str):
        raise BadRequest(f"record_headers must be a string, got {json_type(raw)}")
    try:
        return RecordHeaders(raw.lower())
    except ValueError:
        raise InvalidConsumerConfig(
            f"record_headers must be all, app or none, got {raw!r}"
        ) from None


def _decode_offset_reset(raw: object) -> AutoOffsetReset | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            return AutoOffsetReset(raw.lower())
        except ValueError:
            pass
    raise BadRequest(f"auto.offset.reset must be earliest, latest or none, got {raw!r}")


def _decode_auto_commit(raw: object) -> bool | None:
    if raw is None or isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _BOOLEANS:
        return _BOOLEANS[raw.strip().lower()]
    raise BadRequest(f'auto.commit.enable must be "true" or "false", got {raw!r}')


def _config_int(raw: object, field: str, low: int, high: int) -> int | None:
    if raw is None:
        return None
    # REST Proxy reads these as Integer, which Jackson also fills from a decimal string.
    value = raw
    if isinstance(raw, str) and SIGNED_DECIMAL.fullmatch(raw.strip()) is not None:
        value = int(raw.strip())
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{field} must be an integer from {low} to {high}, got {raw!r}")
    return value


def _strict_int(raw: object, where: str, low: int, high: int) -> int | None:
    return None if raw is None else int_in_range(raw, where, low, high)


def _decode_callback_url(raw: object, allow_remote: bool) -> str | None:
    if raw is None:
        return None
    if (
        not isinstance(raw, str)
        or len(raw) > MAX_CALLBACK_URL_LENGTH
        or _VISIBLE_ASCII.fullmatch(raw) is None
    ):
        raise BadRequest(
            f"callback_url must be an http URL of at most {MAX_CALLBACK_URL_LENGTH} visible "
            f"ASCII characters, got {raw!r}"
        )
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError as exc:
        raise BadRequest(f"callback_url {raw!r} is not a valid URL: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise BadRequest(f"callback_url must be an absolute http or https URL, got {raw!r}")
    if parts.username is not None or parts.password is not None:
        raise BadRequest("callback_url must not carry credentials (user:password@)")
    if not allow_remote and not _is_loopback(parts.hostname):
        raise BadRequest(
            f"callback_url host {parts.hostname!r} is not a loopback host (127.0.0.0/8, ::1 "
            "or localhost); this sidecar calls back only its own application"
        )
    return raw


def _is_loopback(host: str) -> bool:
    if host == "localhost":  # urlsplit has already lowered the case
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    # Spelled out: Python 3.13 also counts ::ffff:127.0.0.1 as loopback, 3.11 does not.
    return address == _IPV6_LOOPBACK or (address.version == 4 and address.is_loopback)
