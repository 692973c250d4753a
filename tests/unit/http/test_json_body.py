"""The JSON request-body validator (``sidecar.http.json_body``): what a body decodes to,
and the one 400 (``BadRequest``, error code 40001) every refusal gives, with a message
that says what was wrong."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.core.errors import BadRequest, InvalidRecord
from sidecar.http.error_map import error_response
from sidecar.http.json_body import (
    field,
    is_utf8,
    json_object,
    json_type,
    parse_json,
    refuse_constant,
    refuse_unknown_fields,
)


def refused(body: bytes) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        parse_json(body)
    error = caught.value
    assert (error.http_status, error.error_code) == (400, 40001)
    return error


def refused_object(body: bytes, allowed: set[str], required: set[str]) -> str:
    with pytest.raises(BadRequest) as caught:
        json_object(body, allowed, required)
    assert (caught.value.http_status, caught.value.error_code) == (400, 40001)
    return caught.value.message


# parse_json: what is accepted ----------------------------------------------------------


def test_a_json_object_body_decodes_to_its_python_values() -> None:
    body = '{"s": "é😀", "i": -3, "f": 1.5, "b": true, "n": null, "a": [1, {"x": []}]}'
    assert parse_json(body.encode()) == {
        "s": "é😀",
        "i": -3,
        "f": 1.5,
        "b": True,
        "n": None,
        "a": [1, {"x": []}],
    }


@pytest.mark.parametrize(
    ("body", "expected"),
    [(b"[1, 2]", [1, 2]), (b'"text"', "text"), (b"7", 7), (b"null", None), (b"false", False)],
)
def test_any_json_value_is_accepted_at_the_top_level(body: bytes, expected: object) -> None:
    # The shape is each caller's business (json_object, the codecs), not the parser's.
    assert parse_json(body) == expected


def test_an_integer_beyond_64_bits_is_kept_exactly() -> None:
    value = parse_json(b'{"offset": 18446744073709551617}')
    assert value == {"offset": 2**64 + 1}
    assert isinstance(value, dict)
    assert isinstance(value["offset"], int)


def test_surrounding_whitespace_is_allowed() -> None:
    assert parse_json(b' \r\n\t{"a": 1}\n') == {"a": 1}


def test_a_repeated_field_keeps_its_last_value() -> None:
    assert parse_json(b'{"a": 1, "a": 2}') == {"a": 2}


# parse_json: what is refused -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "request body is not valid JSON: Expecting value at line 1 column 1"),
        (b'{"a":', "request body is not valid JSON: Expecting value at line 1 column 6"),
        (
            b"{'a': 1}",
            "request body is not valid JSON: Expecting property name enclosed in double quotes"
            " at line 1 column 2",
        ),
        (b'{"a": 1}\n{"b": 2}', "request body is not valid JSON: Extra data at line 2 column 1"),
        (b"[1, 2,]", "request body is not valid JSON: Expecting value at line 1 column 7"),
    ],
)
def test_a_body_that_is_not_json_gets_400_naming_line_and_column(body: bytes, message: str) -> None:
    assert refused(body).message == message


def test_an_empty_body_is_not_json() -> None:
    assert "Expecting value" in refused(b"").message
    assert "Expecting value" in refused(b"  \n ").message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_get_400_wherever_they_are(literal: str) -> None:
    for body in (literal, f"[1, {literal}]", f'{{"a": {{"b": {literal}}}}}'):
        error = refused(body.encode())
        assert error.message == f"request body is not valid JSON: {literal} is not a JSON value"


def test_refuse_constant_names_the_constant() -> None:
    with pytest.raises(ValueError, match=r"^NaN is not a JSON value$"):
        refuse_constant("NaN")


def test_an_integer_too_long_to_convert_gets_400() -> None:
    # Python refuses int() of more than 4300 digits; the body is refused, not a 500.
    error = refused(b'{"n": ' + b"9" * 5000 + b"}")
    assert error.message.startswith("request body is not valid JSON: ")
    assert "digits" in error.message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff{}", "request body is not UTF-8 (byte 0: invalid start byte)"),
        (b'{"a": "\xc3"}', "request body is not UTF-8 (byte 7: invalid continuation byte)"),
        # Latin-1 "é": a client that did not encode its body as UTF-8.
        (b'{"a": "caf\xe9"}', "request body is not UTF-8 (byte 10: invalid continuation byte)"),
        # A surrogate written as UTF-8 bytes (CESU-8 / WTF-8), which UTF-8 forbids.
        (b'"\xed\xa0\x80"', "request body is not UTF-8 (byte 1: invalid continuation byte)"),
    ],
)
def test_a_body_that_is_not_utf8_gets_400_naming_the_byte(body: bytes, message: str) -> None:
    assert refused(body).message == message


def test_a_utf16_body_gets_400() -> None:
    assert "not UTF-8" in refused('{"a": 1}'.encode("utf-16")).message


def test_a_utf8_byte_order_mark_gets_400() -> None:
    error = refused(b'\xef\xbb\xbf{"a": 1}')
    assert error.message.startswith("request body is not valid JSON: Unexpected UTF-8 BOM")


def test_nesting_too_deep_gets_400() -> None:
    depth = 100_000
    error = refused(b"[" * depth + b"]" * depth)
    assert error.message == "request body is nested too deeply"


def test_ordinary_nesting_is_accepted() -> None:
    depth = 50
    value: Any = parse_json(b'{"a":' * depth + b"1" + b"}" * depth)
    for _ in range(depth):
        value = value["a"]
    assert value == 1


def test_a_refusal_does_not_chain_the_parser_exception() -> None:
    # The message is the whole story; no JSONDecodeError traceback rides along.
    error = refused(b"{")
    assert error.__cause__ is None
    assert error.__suppress_context__


def test_a_refused_body_is_answered_rest_proxy_style() -> None:
    response = error_response(refused(b"{"))
    assert response.status == 400
    assert response.text is not None
    assert json.loads(response.text) == {
        "error_code": 40001,
        "message": "request body is not valid JSON: "
        "Expecting property name enclosed in double quotes at line 1 column 2",
    }


# Lone surrogates --------------------------------------------------------------------------


def test_an_escaped_lone_surrogate_parses_and_is_utf8_tells_it_apart() -> None:
    # JSON allows "\ud800"; UTF-8 cannot carry it, so callers check with is_utf8.
    value = parse_json(b'{"name": "a\\ud800b"}')
    assert value == {"name": "a\ud800b"}
    assert isinstance(value, dict)
    assert is_utf8(value["name"]) is False


def test_an_escaped_surrogate_pair_is_one_character_and_is_utf8() -> None:
    value = parse_json(b'"\\ud83d\\ude00"')
    assert value == "😀"
    assert isinstance(value, str)
    assert is_utf8(value) is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", True), ("plain", True), ("é中😀", True), ("\udfff", False), ("ok\ud800", False)],
)
def test_is_utf8_is_false_only_for_text_utf8_cannot_encode(text: str, expected: bool) -> None:
    assert is_utf8(text) is expected


# json_object: admin request bodies ---------------------------------------------------------


@pytest.mark.parametrize("body", [b"", b" ", b"\r\n\t "])
def test_an_empty_admin_body_is_an_empty_object(body: bytes) -> None:
    assert json_object(body, {"compacted"}, set()) == {}


def test_an_empty_admin_body_still_needs_its_required_fields() -> None:
    message = refused_object(b"", {"partitions"}, {"partitions"})
    assert message == "missing field(s): partitions"


def test_an_admin_body_with_allowed_fields_is_returned_as_is() -> None:
    body = b'{"partitions": 4, "compacted": true}'
    document = json_object(body, {"partitions", "compacted", "configs"}, {"partitions"})
    assert document == {"partitions": 4, "compacted": True}


@pytest.mark.parametrize("body", [b"[]", b'"x"', b"3", b"null", b"true", b'[{"a": 1}]'])
def test_an_admin_body_that_is_not_an_object_gets_400(body: bytes) -> None:
    assert refused_object(body, {"a"}, set()) == "request body must be a JSON object"


def test_an_admin_body_with_unknown_fields_gets_400_listing_them_sorted() -> None:
    message = refused_object(b'{"z": 1, "a": 2, "ok": 3}', {"ok"}, set())
    assert message == "unknown field(s): a, z"


def test_an_admin_body_missing_required_fields_gets_400_listing_them_sorted() -> None:
    message = refused_object(b'{"b": 1}', {"b", "x", "c"}, {"x", "c"})
    assert message == "missing field(s): c, x"


def test_an_admin_body_that_is_not_json_gets_the_parse_error() -> None:
    assert refused_object(b'{"a": NaN}', {"a"}, set()) == (
        "request body is not valid JSON: NaN is not a JSON value"
    )
    assert refused_object(b"\xff", {"a"}, set()).startswith("request body is not UTF-8")


# field: one typed field of a decoded object ----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind"),
    [(3, int), (0, int), ("s", str), ("", str), (True, bool), (False, bool), (2.5, float)],
)
def test_a_present_field_of_the_asked_type_is_returned(value: object, kind: type) -> None:
    result = field({"x": value}, "x", kind)
    assert result == value
    assert type(result) is type(value)


def test_an_absent_field_is_none_without_a_default() -> None:
    assert field({}, "x", int) is None


def test_an_absent_field_is_its_default() -> None:
    assert field({}, "x", int, 7) == 7
    assert field({}, "x", bool, False) is False


def test_an_integer_is_a_number_and_comes_back_as_float() -> None:
    result = field({"x": 3}, "x", float)
    assert result == 3.0
    assert type(result) is float


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        ("3", int, 'x must be an integer, got "3"'),
        (True, int, "x must be an integer, got true"),
        (1.0, int, "x must be an integer, got 1.0"),
        (None, int, "x must be an integer, got null"),
        (1, bool, "x must be true or false, got 1"),
        ("true", bool, 'x must be true or false, got "true"'),
        (5, str, "x must be a string, got 5"),
        (None, str, "x must be a string, got null"),
        ("1.5", float, 'x must be a number, got "1.5"'),
        (False, float, "x must be a number, got false"),
        ([1], int, "x must be an integer, got [1]"),
        ({"a": 1}, str, 'x must be a string, got {"a": 1}'),
    ],
)
def test_a_field_of_the_wrong_type_gets_400_naming_the_field_and_value(
    value: object, kind: type, message: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        field({"x": value}, "x", kind)
    assert caught.value.message == message
    assert (caught.value.http_status, caught.value.error_code) == (400, 40001)


def test_an_explicit_null_is_not_taken_for_an_absent_field() -> None:
    with pytest.raises(BadRequest, match="got null"):
        field({"x": None}, "x", int, 5)


# json_type and refuse_unknown_fields: the words of the codecs' messages ---------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, "null"),
        (True, "boolean"),
        (False, "boolean"),
        (0, "number"),
        (2**70, "number"),
        (1.5, "number"),
        ("", "string"),
        ([], "array"),
        ({}, "object"),
    ],
)
def test_json_type_names_a_decoded_value_in_json_terms(value: object, name: str) -> None:
    assert json_type(value) == name


def test_unknown_fields_raise_the_callers_error_naming_them_and_the_known_ones() -> None:
    with pytest.raises(InvalidRecord) as caught:
        refuse_unknown_fields(
            {"value": 1, "vlaue": 2, "Key": 3},
            frozenset({"value", "key"}),
            "records[0]",
            InvalidRecord,
        )
    assert caught.value.message == (
        "records[0] has unknown field(s) ['Key', 'vlaue']; known: ['key', 'value']"
    )
    assert (caught.value.http_status, caught.value.error_code) == (422, 42201)


@pytest.mark.parametrize("raw", [{}, {"key": None}, {"key": 1, "value": 2}])
def test_known_fields_only_pass(raw: dict[str, object]) -> None:
    refuse_unknown_fields(raw, frozenset({"value", "key"}), "record", BadRequest)


@pytest.mark.parametrize("body", [b"1e400", b"[-1e400]", b'{"x": {"y": 2E+999}}'])
def test_a_number_beyond_a_double_gets_400(body: bytes) -> None:
    # As a double it is Infinity, which would be written into the record as non-JSON.
    with pytest.raises(BadRequest) as raised:
        parse_json(body)
    assert "out of the range of a double" in raised.value.message


def test_large_finite_numbers_are_kept() -> None:
    assert parse_json(b"[1e308, -1.5e-320]") == [1e308, -1.5e-320]
