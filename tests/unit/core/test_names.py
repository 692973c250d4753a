"""The name rules (``sidecar.core.names``), against Kafka's own topic rule and each other."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core import names
from sidecar.core.errors import InvalidName


def kafka_accepts_topic(name: str) -> bool:
    """Kafka's ``Topic.validate``, restated: legal characters, length, not . or .."""
    legal = all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    return legal and 0 < len(name) <= 249 and name not in (".", "..")


ASCII_AND_MORE = st.text(
    alphabet=st.one_of(
        st.sampled_from("abcXYZ019._-~:/\\ %\x00\r\n"), st.characters(codec="utf-8")
    ),
    max_size=300,
)


@given(ASCII_AND_MORE)
def test_topic_names_are_exactly_the_ones_kafka_accepts(name: str) -> None:
    assert names.is_topic_name(name) == kafka_accepts_topic(name)
    if kafka_accepts_topic(name):
        assert names.topic_name(name) == name
    else:
        with pytest.raises(InvalidName):
            names.topic_name(name)


CHECKS: list[Callable[[object, str], str]] = [
    names.topic_name,
    names.group_name,
    names.instance_name,
    names.sidecar_id,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "a/b", "../../etc", "a\x00b", "a\r\nb", "é", "a b", "a:b", "x" * 256, 5, None],
)
def test_what_no_name_may_be(check: Callable[[object, str], str], name: object) -> None:
    with pytest.raises(InvalidName) as raised:
        check(name, "where")
    assert raised.value.http_status == 400
    assert raised.value.message.startswith("where ")


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", ["orders", "orders.v2", "a-b_c", "_", "...", "A9"])
def test_ordinary_names_pass_every_rule(check: Callable[[object, str], str], name: str) -> None:
    assert check(name, "where") == name


@given(ASCII_AND_MORE)
def test_every_accepted_name_is_a_safe_znode_name_and_url_segment(name: str) -> None:
    for check in CHECKS:
        try:
            check(name, "where")
        except InvalidName:
            continue
        assert re.fullmatch(r"[A-Za-z0-9._~-]+", name)
        assert name not in (".", "..")


def test_group_and_instance_names_allow_a_tilde_topics_and_sidecar_ids_do_not() -> None:
    assert names.group_name("billing~v2") == "billing~v2"
    assert names.instance_name("b~1") == "b~1"
    with pytest.raises(InvalidName):
        names.topic_name("billing~v2")
    with pytest.raises(InvalidName):  # it is part of Kafka transactional ids too
        names.sidecar_id("host~1")


def test_a_long_refused_name_is_shortened_in_the_message() -> None:
    with pytest.raises(InvalidName) as raised:
        names.topic_name("/" * 100_000)
    assert len(raised.value.message) < 300
    assert "100000 characters" in raised.value.message
