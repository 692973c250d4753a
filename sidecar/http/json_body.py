"""The one validator of JSON request bodies: parsing, objects, fields, JSON types.

Every handler and codec of the HTTP layer reads a JSON body through here, so every
endpoint refuses the same things the same way (400, ``BadRequest``): bytes that are
not UTF-8, NaN and Infinity (also a number too large for a double, which would be
written back as Infinity), nesting too deep, unknown or missing fields, a value of
the wrong JSON type.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NoReturn

from sidecar.core.errors import BadRequest, SidecarError


def parse_json(body: bytes) -> object:
    # RFC 8259 §8.1: JSON between systems is UTF-8, so there is nothing to sniff.
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        return json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    except ValueError as exc:
        # Raised for NaN/Infinity below and for integers too long to convert.
        raise BadRequest(f"request body is not valid JSON: {exc}") from None


def finite_float(text: str) -> float:
    # 1e400 is valid JSON text, but as a double it is Infinity: encoded back into a
    # record it would become the non-JSON constant the body may not contain.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of the range of a double")
    return value


def refuse_constant(name: str) -> NoReturn:
    # Python's json accepts NaN and Infinity; JSON does not, and Kafka consumers will not.
    raise ValueError(f"{name} is not a JSON value")


def refuse_unknown_fields(
    raw: Mapping[str, object],
    known: frozenset[str],
    where: str,
    error: type[SidecarError],
) -> None:
    unknown = sorted(raw.keys() - known)
    if unknown:
        raise error(f"{where} has unknown field(s) {unknown}; known: {sorted(known)}")


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def json_object(raw: bytes, allowed: set[str], required: set[str]) -> dict[str, Any]:
    """An admin request's body: a JSON object (an empty body is ``{}``) with only the
    ``allowed`` fields and every ``required`` one. Raises BadRequest."""
    document: object = {} if not raw.strip() else parse_json(raw)
    if not isinstance(document, dict):
        raise BadRequest("request body must be a JSON object")
    unknown = sorted(set(document) - allowed)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    missing = sorted(required - set(document))
    if missing:
        raise BadRequest(f"missing field(s): {', '.join(missing)}")
    return document


def field(document: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """``document[name]`` of type ``kind`` (an integer is a number), or ``default``
    when absent. Raises BadRequest."""
    value = document.get(name, default)
    if value is None and default is None and name not in document:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"{name} must be {_kind_name(kind)}, got {json.dumps(value)}")
    return value


def is_utf8(text: str) -> bool:
    # json.loads lets "\ud800" through as a lone surrogate, which UTF-8 cannot encode.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind_name(kind: type) -> str:
    return {int: "an integer", bool: "true or false", str: "a string", float: "a number"}.get(
        kind, kind.__name__
    )
