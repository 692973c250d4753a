"""``sidecar.commands.topics``: the ``topics`` subcommands' arguments, the admin API
requests they make to a sidecar (a stand-in one here), what they print and their exit
statuses. The command's coroutine (``_topics``) runs in the test's loop, beside the
stand-in sidecar; ``run_topics`` only wraps it in ``asyncio.run``."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sidecar.commands import topics

TOKEN = "adm1n"


def parse(*argv: str, url: str = "http://127.0.0.1:1") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sidecar")
    topics.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["topics", "--url", url, "--token", TOKEN, *argv])


@dataclass
class _Sidecar:
    """The admin API of a sidecar: answers are set per route; keeps every request."""

    answers: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append(
            (request.method, request.path, body, request.headers.get("Authorization", ""))
        )
        status, document = self.answers.get((request.method, request.path), (404, {}))
        return web.json_response(document, status=status)


@pytest.fixture
async def sidecar() -> AsyncIterator[tuple[_Sidecar, str]]:
    stand_in = _Sidecar()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stand_in.handle)
    server = TestServer(app)
    await server.start_server()
    try:
        yield stand_in, str(server.make_url("/"))
    finally:
        await server.close()


# Arguments ---------------------------------------------------------------------------------


def test_create_defaults_to_three_replicas_ordered_and_not_compacted() -> None:
    args = parse("create", "orders", "--partitions", "4")
    assert (args.action, args.topic, args.partitions) == ("create", "orders", 4)
    assert (args.replication_factor, args.compacted, args.unordered) == (3, False, False)
    assert args.handler is topics.run_topics


def test_only_shrink_takes_a_delete_delay_and_waits_for_retirement() -> None:
    shrink = parse("shrink", "orders", "--to", "2", "--delete-after", "60", "--wait-retired")
    assert (shrink.count, shrink.delete_after_seconds, shrink.wait_retired) == (2, 60.0, True)
    with pytest.raises(SystemExit):
        parse("expand", "orders", "--to", "4", "--delete-after", "60")


def test_a_change_needs_its_target_count() -> None:
    with pytest.raises(SystemExit):
        parse("expand", "orders")


def test_the_url_and_token_default_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERED_SIDECAR_URL", "http://sidecar:9000")
    monkeypatch.setenv("ORDERED_SIDECAR_ADMIN_TOKEN", "from-env")
    parser = argparse.ArgumentParser(prog="sidecar")
    topics.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["topics", "describe", "orders"])
    assert (args.url, args.token) == ("http://sidecar:9000", "from-env")


# Requests ----------------------------------------------------------------------------------


async def test_create_posts_the_topic_with_the_token_and_prints_the_answer(
    sidecar: tuple[_Sidecar, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stand_in, url = sidecar
    stand_in.answers["POST", "/admin/topics"] = (201, {"name": "orders", "generation": 1})
    args = parse("create", "orders", "--partitions", "2", "--compacted", "--unordered", url=url)
    assert await topics._topics(args) == 0
    assert stand_in.requests == [
        (
            "POST",
            "/admin/topics",
            {
                "name": "orders",
                "partitions": 2,
                "replication_factor": 3,
                "compacted": True,
                "ordered_delivery": False,
            },
            f"Bearer {TOKEN}",
        )
    ]
    assert json.loads(capsys.readouterr().out) == {"name": "orders", "generation": 1}


async def test_adopt_and_describe_name_the_topic_in_the_path(
    sidecar: tuple[_Sidecar, str],
) -> None:
    stand_in, url = sidecar
    stand_in.answers["POST", "/admin/topics/orders/adopt"] = (200, {})
    stand_in.answers["GET", "/admin/topics/orders"] = (200, {})
    assert await topics._topics(parse("adopt", "orders", url=url)) == 0
    assert await topics._topics(parse("describe", "orders", url=url)) == 0
    assert [(m, p, b) for m, p, b, _ in stand_in.requests] == [
        ("POST", "/admin/topics/orders/adopt", {"compacted": False, "ordered_delivery": True}),
        ("GET", "/admin/topics/orders", None),
    ]


async def test_an_error_answer_is_printed_and_exits_1(
    sidecar: tuple[_Sidecar, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = sidecar  # nothing is answered: 404
    assert await topics._topics(parse("describe", "nosuch", url=url)) == 1
    assert json.loads(capsys.readouterr().out) == {}


async def test_a_sidecar_that_cannot_be_reached_exits_1_naming_it(
    capsys: pytest.CaptureFixture[str], unused_tcp_port: int
) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}"
    assert await topics._topics(parse("describe", "orders", url=url)) == 1
    assert f"sidecar: cannot reach {url}" in capsys.readouterr().err


async def test_an_expansion_prints_the_counts_and_phase_it_reached(
    sidecar: tuple[_Sidecar, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stand_in, url = sidecar
    stand_in.answers["POST", "/admin/topics/orders/partition-count"] = (
        200,
        {"from_count": 2, "target_count": 4, "phase": "committed"},
    )
    assert await topics._topics(parse("expand", "orders", "--to", "4", url=url)) == 0
    posted = [r for r in stand_in.requests if r[0] == "POST"]
    assert [(p, b) for _, p, b, _ in posted] == [
        (
            "/admin/topics/orders/partition-count",
            {"count": 4, "kind": "expand", "validate_only": False},
        )
    ]
    assert "orders: changed 2 -> 4 partitions (committed)" in capsys.readouterr().out


async def test_a_validated_shrink_would_change_and_sends_its_delete_delay(
    sidecar: tuple[_Sidecar, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stand_in, url = sidecar
    stand_in.answers["POST", "/admin/topics/orders/partition-count"] = (
        200,
        {"from_count": 4, "target_count": 2, "phase": "validated"},
    )
    args = parse(
        "shrink", "orders", "--to", "2", "--validate-only", "--delete-after", "30", url=url
    )
    assert await topics._topics(args) == 0
    (posted,) = [b for m, _, b, _ in stand_in.requests if m == "POST"]
    assert posted == {
        "count": 2,
        "kind": "shrink",
        "validate_only": True,
        "delete_after_seconds": 30.0,
    }
    assert "orders: would change 4 -> 2 partitions (validated)" in capsys.readouterr().out


async def test_a_refused_change_prints_the_answer_and_exits_1(
    sidecar: tuple[_Sidecar, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stand_in, url = sidecar
    refusal = {"error_code": 40903, "message": "a change is running"}
    stand_in.answers["POST", "/admin/topics/orders/partition-count"] = (409, refusal)
    assert await topics._topics(parse("expand", "orders", "--to", "4", url=url)) == 1
    assert json.loads(capsys.readouterr().out) == refusal


# confirm-truncation ------------------------------------------------------------------------


async def test_confirming_a_truncation_needs_yes_and_asks_nothing_without(
    sidecar: tuple[_Sidecar, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stand_in, url = sidecar
    assert await topics._topics(parse("confirm-truncation", "orders", url=url)) == 2
    assert stand_in.requests == []
    assert "add --yes" in capsys.readouterr().err


async def test_each_confirmed_loss_is_printed(
    sidecar: tuple[_Sidecar, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stand_in, url = sidecar
    lost = {"partition": 1, "boundary": 40, "generation": 3, "leader_epoch": 7}
    stand_in.answers["POST", "/admin/topics/orders/confirm-truncation"] = (
        200,
        {"confirmed": [{**lost, "log_end": 35}, {**lost, "partition": 2, "log_end": None}]},
    )
    args = parse("confirm-truncation", "orders", "--yes", url=url)
    assert await topics._topics(args) == 0
    assert capsys.readouterr().out.splitlines() == [
        "orders: confirmed the loss below boundary 40 of partition 1 (generation 3, "
        "leader epoch 7; the log now reaches 35)",
        "orders: confirmed the loss below boundary 40 of partition 2 (generation 3, "
        "leader epoch 7; the log now reaches an unknown offset)",
    ]


async def test_a_refused_confirmation_says_why_on_stderr_and_exits_1(
    sidecar: tuple[_Sidecar, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stand_in, url = sidecar
    stand_in.answers["POST", "/admin/topics/orders/confirm-truncation"] = (
        409,
        {"error_code": 40906, "message": "nothing to confirm"},
    )
    args = parse("confirm-truncation", "orders", "--yes", url=url)
    assert await topics._topics(args) == 1
    assert capsys.readouterr().err.strip() == (
        "sidecar topics confirm-truncation: nothing to confirm (HTTP 409, error_code 40906)"
    )


# compact ---------------------------------------------------------------------------------


async def test_compact_asks_the_sidecar_and_prints_what_was_folded(
    sidecar: tuple[_Sidecar, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stand_in, url = sidecar
    answer = {"topic": "orders", "folded": 3, "first_generation": 3, "generation": 5}
    stand_in.answers["POST", "/admin/topics/orders/compaction"] = (200, answer)
    assert await topics._topics(parse("compact", "orders", url=url)) == 0
    assert [(m, p, b) for m, p, b, _ in stand_in.requests] == [
        ("POST", "/admin/topics/orders/compaction", {})
    ]
    assert json.loads(capsys.readouterr().out) == answer
