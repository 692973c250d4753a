"""Creating a REST Proxy v2 consumer instance (``sidecar.http.create_consumer_codec``):
the request's fields and their REST Proxy spellings, defaults, refusals, and which
callback URLs are accepted."""

from __future__ import annotations

import re

import pytest

from sidecar.core.errors import BadRequest
from sidecar.core.names import MAX_INSTANCE_NAME_LENGTH
from sidecar.core.produce import EmbeddedFormat
from sidecar.http.create_consumer_codec import (
    MAX_CALLBACK_TIMEOUT_MS,
    AutoOffsetReset,
    CreateConsumerRequest,
    decode_create_consumer,
)
from sidecar.http.records_codec import RecordHeaders
from tests.unit.http.consumer_support import V2, body


def create(document: object, *, allow_remote: bool = False) -> CreateConsumerRequest:
    return decode_create_consumer(
        body(document), content_type=V2, allow_remote_callbacks=allow_remote
    )


DEFAULTS = CreateConsumerRequest(
    name=None,
    format=EmbeddedFormat.BINARY,
    auto_offset_reset=None,
    auto_commit=None,
    fetch_min_bytes=None,
    request_timeout_ms=None,
    callback_url=None,
    callback_timeout_ms=None,
    # The app's own headers unless it asks for the sidecar's too.
    record_headers=RecordHeaders.APP,
)


@pytest.mark.parametrize(
    ("raw", "content_type"), [(b"", None), (b"", V2), (b"null", V2), (b"{}", V2)]
)
def test_create_without_settings_is_a_binary_consumer(raw: bytes, content_type: str | None) -> None:
    assert decode_create_consumer(raw, content_type=content_type) == DEFAULTS


def test_create_with_every_field() -> None:
    request = create(
        {
            "name": "orders-worker_1.~",
            "format": "json",
            "auto.offset.reset": "earliest",
            "auto.commit.enable": "false",
            "fetch.min.bytes": 1024,
            "consumer.request.timeout.ms": 5000,
            "callback_url": "http://127.0.0.1:9000/keys?app=1",
            "callback_timeout_ms": 30_000,
            "assignment_events": True,
            "record_headers": "app",
        }
    )
    assert request == CreateConsumerRequest(
        name="orders-worker_1.~",
        format=EmbeddedFormat.JSON,
        auto_offset_reset=AutoOffsetReset.EARLIEST,
        auto_commit=False,
        fetch_min_bytes=1024,
        request_timeout_ms=5000,
        callback_url="http://127.0.0.1:9000/keys?app=1",
        callback_timeout_ms=30_000,
        assignment_events=True,
        record_headers=RecordHeaders.APP,
    )


def test_create_null_fields_are_defaults() -> None:
    fields = [
        "name",
        "format",
        "auto.offset.reset",
        "auto.commit.enable",
        "fetch.min.bytes",
        "assignment_events",
        "record_headers",
    ]
    assert create(dict.fromkeys(fields)) == DEFAULTS


@pytest.mark.parametrize(
    ("field", "raw", "attribute", "expected"),
    [
        ("format", "BINARY", "format", EmbeddedFormat.BINARY),
        ("format", "Json", "format", EmbeddedFormat.JSON),
        ("auto.offset.reset", "Latest", "auto_offset_reset", AutoOffsetReset.LATEST),
        ("auto.offset.reset", "none", "auto_offset_reset", AutoOffsetReset.NONE),
        ("auto.commit.enable", "true", "auto_commit", True),
        ("auto.commit.enable", "FALSE", "auto_commit", False),
        ("auto.commit.enable", True, "auto_commit", True),
        ("auto.commit.enable", False, "auto_commit", False),
        ("fetch.min.bytes", -1, "fetch_min_bytes", None),
        ("fetch.min.bytes", "-1", "fetch_min_bytes", None),
        ("fetch.min.bytes", 0, "fetch_min_bytes", 0),
        ("fetch.min.bytes", "512", "fetch_min_bytes", 512),
        ("fetch.min.bytes", 10_000_000, "fetch_min_bytes", 10_000_000),
        ("consumer.request.timeout.ms", "0", "request_timeout_ms", 0),
        ("consumer.request.timeout.ms", 2**31 - 1, "request_timeout_ms", 2**31 - 1),
        ("id", "legacy", "name", "legacy"),
        ("responseMinBytes", 7, "fetch_min_bytes", 7),
        ("requestWaitMs", "250", "request_timeout_ms", 250),
        ("record_headers", "all", "record_headers", RecordHeaders.ALL),
        ("record_headers", "App", "record_headers", RecordHeaders.APP),
        ("record_headers", "NONE", "record_headers", RecordHeaders.NONE),
    ],
)
def test_create_reads_values_as_rest_proxy_does(
    field: str, raw: object, attribute: str, expected: object
) -> None:
    assert getattr(create({field: raw}), attribute) == expected


def test_an_alias_may_repeat_its_field() -> None:
    assert create({"id": "c1", "name": "c1"}).name == "c1"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"format": "avro"}, "format 'avro' needs a schema registry"),
        ({"format": "PROTOBUF"}, "format 'PROTOBUF' needs a schema registry"),
        ({"format": "jsonschema"}, "format 'jsonschema' needs a schema registry"),
        ({"format": "xml"}, "format must be binary or json, got 'xml'"),
        ({"format": 1}, "format must be a string, got number"),
        ({"auto.offset.reset": "smallest"}, "auto.offset.reset must be earliest, latest or none"),
        ({"auto.offset.reset": 0}, "auto.offset.reset must be earliest, latest or none, got 0"),
        ({"auto.commit.enable": "yes"}, 'auto.commit.enable must be "true" or "false"'),
        ({"auto.commit.enable": 1}, 'auto.commit.enable must be "true" or "false", got 1'),
        ({"fetch.min.bytes": -2}, "fetch.min.bytes must be an integer from -1 to 10000000"),
        ({"fetch.min.bytes": 10_000_001}, "fetch.min.bytes must be an integer from -1"),
        ({"fetch.min.bytes": 1.5}, "fetch.min.bytes must be an integer from -1"),
        ({"fetch.min.bytes": "1.5"}, "fetch.min.bytes must be an integer from -1"),
        ({"fetch.min.bytes": "+5"}, "fetch.min.bytes must be an integer from -1"),
        ({"fetch.min.bytes": True}, "fetch.min.bytes must be an integer from -1"),
        ({"consumer.request.timeout.ms": -1}, "consumer.request.timeout.ms must be an integer"),
        ({"consumer.request.timeout.ms": 2**31}, "consumer.request.timeout.ms must be an integer"),
        ({"requestWaitMs": "x"}, "consumer.request.timeout.ms must be an integer"),
        (
            {"name": ""},
            "name '' is not a consumer instance name: use 1 to 255 of A-Z a-z 0-9 . _ - ~",
        ),
        ({"name": "a/b"}, "name 'a/b' is not"),
        ({"name": "a b"}, "name 'a b' is not"),
        ({"name": "é"}, "name 'é' is not"),
        ({"name": "."}, "name '.' is not"),
        ({"name": ".."}, "name '..' is not"),
        (
            {"name": "n" * (MAX_INSTANCE_NAME_LENGTH + 1)},
            "is not a consumer instance name: use 1 to 255",
        ),
        ({"name": 7}, "name must be a string, got number"),
        ({"id": "a", "name": "b"}, "id 'a' conflicts with name 'b'"),
        ({"responseMinBytes": 1, "fetch.min.bytes": 2}, "responseMinBytes 1 conflicts with"),
        ({"isolation.level": "read_committed"}, "unknown field(s) ['isolation.level']"),
        ({"enable.auto.commit": "false"}, "unknown field(s) ['enable.auto.commit']"),
        ({"callback_timeout_ms": 1000}, "callback_timeout_ms is set without callback_url"),
        ({"assignment_events": "true"}, "assignment_events must be true or false, got 'true'"),
        ({"assignment_events": 1}, "assignment_events must be true or false, got 1"),
        ({"record_headers": "ordered"}, "record_headers must be all, app or none, got 'ordered'"),
        ({"record_headers": False}, "record_headers must be a string, got boolean"),
        (
            {"callback_url": "http://localhost/", "callback_timeout_ms": 0},
            f"callback_timeout_ms must be an integer from 1 to {MAX_CALLBACK_TIMEOUT_MS}, got 0",
        ),
        (
            {
                "callback_url": "http://localhost/",
                "callback_timeout_ms": MAX_CALLBACK_TIMEOUT_MS + 1,
            },
            "callback_timeout_ms must be an integer from 1",
        ),
        (
            {"callback_url": "http://localhost/", "callback_timeout_ms": "100"},
            "callback_timeout_ms must be an integer from 1",
        ),
    ],
)
def test_invalid_create_requests(document: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        create(document)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/callback",
        "http://127.255.3.4/",
        "http://[::1]:8080/keys?app=orders",
        "http://localhost/",
        "HTTP://LocalHost:1/x",
        "https://localhost:8443/",
    ],
)
def test_loopback_callback_urls_are_accepted(url: str) -> None:
    assert create({"callback_url": url}).callback_url == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://10.0.0.1/cb", "host '10.0.0.1' is not a loopback host"),
        ("http://example.com/cb", "host 'example.com' is not a loopback host"),
        ("http://localhost.example.com/", "host 'localhost.example.com' is not a loopback"),
        ("http://127.1/", "host '127.1' is not a loopback host"),
        ("http://0.0.0.0:80/", "host '0.0.0.0' is not a loopback host"),
        ("http://[::ffff:127.0.0.1]/", "host '::ffff:127.0.0.1' is not a loopback host"),
        ("http://127.0.0.1.nip.io/", "is not a loopback host"),
        ("http://user:pw@localhost/", "must not carry credentials"),
        ("http://127.0.0.1:8080@example.com/", "must not carry credentials"),
        ("ftp://localhost/", "must be an absolute http or https URL"),
        ("localhost:8080", "must be an absolute http or https URL"),
        ("/callback", "must be an absolute http or https URL"),
        ("http:///callback", "must be an absolute http or https URL"),
        ("http://localhost:99999/", "is not a valid URL"),
        ("http://localhost:port/", "is not a valid URL"),
        ("http://[::1/", "is not a valid URL"),
        ("http://local host/", "visible ASCII characters, got 'http://local host/'"),
        ("http://localhost/\n", "visible ASCII characters"),
        ("http://localhost/" + "x" * 2048, "at most 2048 visible ASCII characters"),
        ("", "visible ASCII characters, got ''"),
        (5, "visible ASCII characters, got 5"),
    ],
)
def test_callback_urls_that_are_refused(url: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        create({"callback_url": url})


def test_remote_callbacks_when_allowed_still_need_http_and_no_credentials() -> None:
    url = "http://app.internal:8080/keys"
    assert create({"callback_url": url}, allow_remote=True).callback_url == url
    with pytest.raises(BadRequest, match="absolute http or https URL"):
        create({"callback_url": "file:///etc/passwd"}, allow_remote=True)
    with pytest.raises(BadRequest, match="credentials"):
        create({"callback_url": "http://u@app.internal/"}, allow_remote=True)
