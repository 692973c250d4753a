"""The one place where exceptions become HTTP responses.

Every error body is REST Proxy style, ``{"error_code": 40910, "message": "..."}``,
so a REST Proxy client's error handling works unchanged. Additions:

* ``"retriable": true`` on errors a client may retry unchanged (absent otherwise, so
  a non-retriable answer is exactly the REST Proxy shape);
* ``current_generation`` / ``current_count`` on ``FencedGeneration``, so the client
  can re-route without another round trip (left out while they are unknown).

Errors aiohttp raises itself (no such route, method not allowed, body over the
server's limit) keep their status and get the code ``status * 100``: ``XXX00`` means
"this status, no more specific reason", as ``50000`` already does for the root
``SidecarError``. The ``status * 100 + 1`` codes are taken by the hierarchy with
other meanings (40401 is an unknown topic, 50001 a Kafka failure), and a client must
not read a mistyped URL as a missing topic.

Anything else is a bug: 500 with code 50000 and a fixed message. The exception is
logged with its traceback, never sent.
"""

from __future__ import annotations

import logging
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from sidecar.core.errors import FencedGeneration, SidecarError
from sidecar.http.produce_codec import V2_RESPONSE_CONTENT_TYPE

_log = logging.getLogger(__name__)

ErrorBody = dict[str, int | str | bool]

# Headers of aiohttp's own error that describe its text/plain body, which is replaced.
_BODY_HEADERS: Final = frozenset({"content-type", "content-length"})


def error_response(exc: BaseException) -> web.Response:
    """The JSON error response for ``exc``; never raises."""
    if isinstance(exc, SidecarError):
        return _json_error(exc.http_status, _sidecar_error_body(exc), dict(exc.headers))
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        # Keep what the status needs beside the body, e.g. Allow on a 405.
        kept = {
            name: value for name, value in exc.headers.items() if name.lower() not in _BODY_HEADERS
        }
        body: ErrorBody = {"error_code": exc.status * 100, "message": exc.reason}
        return _json_error(exc.status, body, kept)
    return _json_error(
        SidecarError.http_status,
        {"error_code": SidecarError.error_code, "message": SidecarError.default_message},
    )


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every error a handler raises with ``error_response``.

    Raises only what is not an error: aiohttp redirects and other non-error
    ``HTTPException``\\ s, and ``BaseException``\\ s such as a cancelled task.
    """
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc)
    except SidecarError as exc:
        if exc.http_status >= 500:
            _log.warning("%s %s failed: %s", request.method, request.path, exc.message)
        return error_response(exc)
    except Exception as exc:
        if isinstance(exc, ConnectionResetError) and client_went_away(request):
            # A client that stopped waiting (its poll timeout passed, its process ended) is
            # not a fault of the sidecar's; the answer below reaches no one.
            _log.debug("%s %s: the client went away", request.method, request.path)
        else:
            _log.exception("unexpected error serving %s %s", request.method, request.path)
        return error_response(exc)


def client_went_away(request: web.BaseRequest) -> bool:
    """Whether the connection ``request`` came on is closed or closing."""
    return request.transport is None or request.transport.is_closing()


def _sidecar_error_body(exc: SidecarError) -> ErrorBody:
    body: ErrorBody = {"error_code": exc.error_code, "message": exc.message}
    if exc.retriable:
        body["retriable"] = True
    if isinstance(exc, FencedGeneration):
        # -1 is the constructor's "not known"; a client could only misuse it.
        if exc.current_generation >= 0:
            body["current_generation"] = exc.current_generation
        if exc.current_count >= 0:
            body["current_count"] = exc.current_count
    return body


def _json_error(
    status: int, body: ErrorBody, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        body, status=status, headers=headers, content_type=V2_RESPONSE_CONTENT_TYPE
    )
