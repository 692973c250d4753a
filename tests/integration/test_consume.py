"""The consume path through real sidecars: REST consumers, the gate, key hand-off."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.consumers import (
    CallbackApp,
    RestConsumer,
    create_consumer,
    decoded,
    post_create_consumer,
)
from ordered_dev.harness.sidecars import running_sidecars, unique
from sidecar.core.routing import partition_for_key


def _moving_key(initial: int, old: int, new: int, source: int) -> str:
    """A key that lives in ``source`` under ``old`` partitions and moves under ``new``."""
    for i in range(100_000):
        key = f"key-{i}"
        encoded = json.dumps(key).encode()
        before = partition_for_key(encoded, initial, old)
        if before == source and partition_for_key(encoded, initial, new) != before:
            return key
    raise AssertionError("no such key")


async def _drain(consumer: RestConsumer, want: int, within_s: float = 20) -> list[dict]:  # type: ignore[type-arg]
    got: list[dict] = []  # type: ignore[type-arg]
    deadline = time.monotonic() + within_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"got {len(got)} of {want} records"
        records, events = await consumer.poll(300)
        assert events == [], events
        got += records
    return got


async def test_a_group_receives_every_record_in_key_order(cluster: ClusterEndpoints) -> None:
    topic = unique("consume")
    group = unique("group")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 3, replication_factor=cluster.replication_factor)
        records = [{"key": f"k{i % 5}", "value": i} for i in range(50)]
        status, body = await sidecar.produce(topic, records)
        assert status == 200, body
        consumer = await create_consumer(sidecar, group, "c1")
        await consumer.subscribe(topic)
        got = await _drain(consumer, 50)
        per_key: dict[bytes, list[int]] = {}
        for record in got:
            key, value = decoded(record)
            assert key is not None
            assert value is not None
            per_key.setdefault(key, []).append(json.loads(value))
        assert all(values == sorted(values) for values in per_key.values())
        assert sum(len(v) for v in per_key.values()) == 50
        status, _ = await consumer.commit()
        assert status == 204
        status, answer = await consumer.call(
            "GET", "/offsets", {"partitions": [{"topic": topic, "partition": p} for p in range(3)]}
        )
        assert status == 200
        # Committing everything delivered commits past each partition's transaction
        # marker too (one transaction: one marker per partition), to the log end.
        ends = await sidecar.server.kafka.end_offsets(topic, 3)
        assert sum(ends) == 50 + 3
        assert [entry["offset"] for entry in answer["offsets"]] == ends
        await consumer.delete()


async def test_the_new_partition_waits_for_its_blocker_to_be_committed(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("gate")
    group = unique("group")
    key = _moving_key(1, 1, 2, 0)
    app = CallbackApp()
    await app.start()
    try:
        async with running_sidecars(cluster, 2) as sidecars:
            await sidecars[0].create_topic(topic, 1, replication_factor=cluster.replication_factor)
            await sidecars[0].produce(topic, [{"key": key, "value": i} for i in range(5)])
            await sidecars[0].change_count(topic, 2)
            status, body = await sidecars[0].produce(
                topic, [{"key": key, "value": i} for i in range(5, 10)]
            )
            assert {e["partition"] for e in body["offsets"]} == {1}, body
            # Two instances of one group on two sidecars: old owns partition 0, new 1.
            old = await create_consumer(sidecars[0], group, "old", callback_url=app.url)
            new = await create_consumer(sidecars[1], group, "new", callback_url=app.url)
            await old.assign((topic, 0))
            await new.assign((topic, 1))

            # The new partition's records wait: the group has not consumed partition 0.
            for _ in range(3):
                records, _ = await new.poll(200)
                assert records == []
            got_old = await _drain(old, 5)
            assert [json.loads(decoded(r)[1] or b"") for r in got_old] == [0, 1, 2, 3, 4]
            records, _ = await new.poll(200)
            assert records == []  # delivered is not committed

            status, _ = await old.commit()
            assert status == 204
            committed_at = time.monotonic()
            got_new: list[dict] = []  # type: ignore[type-arg]
            while not got_new:
                assert time.monotonic() - committed_at < 20, "the gate never opened"
                got_new, _ = await new.poll(300)
            first_gated_record_at = time.monotonic()
            released_after = first_gated_record_at - committed_at
            got_new += await _drain(new, 5 - len(got_new))
            assert [json.loads(decoded(r)[1] or b"") for r in got_new] == [5, 6, 7, 8, 9]
            print(f"gate released {released_after * 1000:.0f} ms after the blocker's commit")
    finally:
        await app.stop()
    kinds = [(body["type"], body["partition"], body["instance_id"]) for *_, body in app.events]
    assert kinds == [("keys_revoked", 0, "old"), ("keys_assigned", 1, "new")]
    (_, revoke_done, _), (assign_started, assign_done, _) = app.events
    assert revoke_done <= assign_started
    assert assign_done <= first_gated_record_at


async def test_hand_off_events_in_the_records_response(cluster: ClusterEndpoints) -> None:
    topic = unique("events")
    group = unique("group")
    key = _moving_key(1, 1, 2, 0)
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 1, replication_factor=cluster.replication_factor)
        await sidecar.produce(topic, [{"key": key, "value": i} for i in range(3)])
        await sidecar.change_count(topic, 2)
        await sidecar.produce(topic, [{"key": key, "value": i} for i in range(3, 6)])
        old = await create_consumer(sidecar, group, "old")
        new = await create_consumer(sidecar, group, "new")
        await old.assign((topic, 0))
        await new.assign((topic, 1))
        await _drain(old, 3)

        # Committing past the boundary needs the keys_revoked event acknowledged first.
        status, body = await old.commit()
        assert (status, body["error_code"]) == (409, 40940), body
        records, events = await old.poll(100)
        assert records == []
        assert [(e["type"], e["partition"]) for e in events] == [("keys_revoked", 0)]
        await old.ack(events[0]["event_id"])
        status, body = await old.commit()
        assert status == 204, body

        # The new partition first announces its keys, and delivers after the ack.
        deadline = time.monotonic() + 10
        while True:
            records, events = await new.poll(200)
            assert records == []
            if events:
                break
            assert time.monotonic() < deadline
        assert [(e["type"], e["partition"]) for e in events] == [("keys_assigned", 1)]
        await new.ack(events[0]["event_id"])
        got = await _drain(new, 3)
        assert [json.loads(decoded(r)[1] or b"") for r in got] == [3, 4, 5]


async def _read_stream(
    consumer: RestConsumer, done: Callable[[list[dict[str, Any]]], bool], within_s: float = 30
) -> list[dict[str, Any]]:
    """Every item of successive records responses, in order, until ``done`` says so."""
    stream: list[dict[str, Any]] = []
    deadline = time.monotonic() + within_s
    while not done(stream):
        assert time.monotonic() < deadline, stream
        status, body = await consumer.call("GET", "/records", timeout="300")
        assert status == 200, body
        stream += body
    return stream


def _assigned_before_records(stream: list[dict[str, Any]], topic: str) -> set[int]:
    """Check that every record comes from a partition a notice said is assigned; the
    partitions assigned at the end."""
    assigned: set[int] = set()
    for item in stream:
        if item.get("type") == "partitions_assigned":
            assigned = {p["partition"] for p in item["partitions"]}
        elif item.get("type") == "partitions_revoked":
            assigned -= {p["partition"] for p in item["partitions"]}
        elif "type" not in item:
            assert item["partition"] in assigned, (item, stream)
    assert all(p["topic"] == topic for i in stream for p in i.get("partitions", []))
    return assigned


async def test_rebalances_are_told_when_asked_for(cluster: ClusterEndpoints) -> None:
    topic = unique("notices")
    group = unique("group")
    app = CallbackApp()
    await app.start()
    try:
        async with running_sidecars(cluster, 1) as (sidecar,):
            await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
            status, body = await sidecar.produce(
                topic, [{"key": f"k{i}", "value": i} for i in range(20)]
            )
            assert {entry["partition"] for entry in body["offsets"]} == {0, 1}, body

            def records_in(stream: list[dict[str, Any]]) -> int:
                return sum("type" not in item for item in stream)

            first = await create_consumer(sidecar, group, "first", assignment_events=True)
            await first.subscribe(topic)
            stream = await _read_stream(first, lambda items: records_in(items) == 20)
            assert stream[0] == {
                "type": "partitions_assigned",
                "partitions": [{"topic": topic, "partition": p} for p in (0, 1)],
            }
            assert _assigned_before_records(stream, topic) == {0, 1}
            status, _ = await first.commit()
            assert status == 204

            # A second member (told by callback) joins: the first hears it lost everything
            # and got one partition back, in the stream of its records responses.
            second = await create_consumer(
                sidecar, group, "second", assignment_events=True, callback_url=app.url
            )
            await second.subscribe(topic)
            later = await _read_stream(
                first,
                lambda items: any(i.get("type") == "partitions_assigned" for i in items),
            )
            notices = [(i["type"], [p["partition"] for p in i["partitions"]]) for i in later]
            assert notices[0] == ("partitions_revoked", [0, 1]), notices
            assert notices[1][0] == "partitions_assigned"
            (kept,) = notices[1][1]
            deadline = time.monotonic() + 10
            while not app.events:
                assert time.monotonic() < deadline, "the second member was never told"
                await asyncio.sleep(0.05)
            (*_, told) = app.events[0]
            assert told == {
                "type": "partitions_assigned",
                "group": group,
                "instance_id": "second",
                "partitions": [{"topic": topic, "partition": 1 - kept}],
            }

            # A member that did not ask is told nothing (REST Proxy's records response).
            plain = await create_consumer(sidecar, unique("group"), "plain")
            await plain.subscribe(topic)
            got = await _read_stream(plain, lambda items: len(items) >= 20)
            assert all("type" not in item for item in got)
    finally:
        await app.stop()


async def test_relocation_tombstones_are_never_delivered(cluster: ClusterEndpoints) -> None:
    topic = unique("tomb")
    group = unique("group")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(
            topic, 2, replication_factor=cluster.replication_factor, compacted=True
        )
        await sidecar.change_count(topic, 3)
        keys = [f"k{i}" for i in range(30)]
        await sidecar.produce(topic, [{"key": k, "value": 1} for k in keys])
        assert sidecar.server.metrics.relocation_tombstones.labels(topic)._value.get() > 0
        consumer = await create_consumer(sidecar, group, "c", **{"auto.commit.enable": "true"})
        await consumer.subscribe(topic)
        got = await _drain(consumer, 30)
        records, _ = await consumer.poll(500)
        assert records == []
        assert all(decoded(r)[1] == b"1" for r in got)


async def test_consumer_bad_input(cluster: ClusterEndpoints) -> None:
    group = unique("group")
    async with running_sidecars(cluster, 1) as (sidecar,):
        consumer = await create_consumer(sidecar, group, "c")
        unknown = RestConsumer(sidecar, group, "nobody")
        status, body = await unknown.call("GET", "/records")
        assert (status, body["error_code"]) == (404, 40403)
        status, body = await consumer.call("GET", "/records")
        assert (status, body["error_code"]) == (409, 40940)
        status, body = await post_create_consumer(
            sidecar, group, {"name": "x", "callback_url": "http://example.com/cb"}
        )
        assert (status, body["error_code"]) == (400, 40001)
        topic = unique("t")
        await sidecar.create_topic(topic, 1, replication_factor=cluster.replication_factor)
        await consumer.assign((topic, 0))
        status, body = await consumer.commit([{"topic": topic, "partition": 0, "offset": 5}])
        assert (status, body["error_code"]) == (400, 40001)
        status, body = await consumer.call("POST", "/offsets", {"offsets": [{"topic": topic}]})
        assert (status, body["error_code"]) == (400, 40001)
        status, body = await consumer.call("POST", "/consumers-not-a-route")
        assert status == 404


STALL_RECOVERED_WITHIN_S = 30.0
"""A rebalance of a one-member group, asked at once; well within a Kafka session."""


async def test_a_stalled_sidecar_rebalances_before_it_tells_or_delivers_more(
    cluster: ClusterEndpoints,
) -> None:
    """A long chaos run: sidecars stopped past their sessions resumed still owning
    partitions the group had given to others, and told their apps keys_revoked that the
    new owners told too. After its event loop did not run for ``consumer.stall_fence_s``
    (here it is blocked, as a stopped process's is) an instance tells and releases
    nothing until its group has rebalanced, asks for that rebalance, and goes on."""
    topic, group = unique("stall"), unique("group")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        await sidecar.produce(topic, [{"key": f"k{i}", "value": i} for i in range(10)])
        consumer = await create_consumer(sidecar, group, "c")
        await consumer.subscribe(topic)
        await _drain(consumer, 10)
        status, body = await consumer.commit()  # else the rebalance delivers them again
        assert status == 204, body
        metrics = sidecar.server.metrics
        label = metrics.group_label(group)
        requested = metrics.rebalance_requests.labels(label)._value.get()
        rebalances = metrics.rebalances.labels(label)._value.get()
        await sidecar.produce(topic, [{"key": f"k{i}", "value": i} for i in range(10, 20)])
        state = sidecar.server.consumers.instances[(group, "c")].state

        def fenced() -> bool:
            return state.fenced

        assert not fenced()

        # The loop must not run, as in a stopped process.
        time.sleep(sidecar.server.settings.consumer.stall_fence_s + 0.5)  # noqa: ASYNC251
        assert fenced()  # before the loop has run again
        got = await _drain(consumer, 10, within_s=STALL_RECOVERED_WITHIN_S)
        assert sorted(json.loads(decoded(r)[1] or b"") for r in got) == list(range(10, 20))
        assert not fenced()
        assert metrics.rebalance_requests.labels(label)._value.get() == requested + 1
        assert metrics.rebalances.labels(label)._value.get() > rebalances


async def test_a_caught_up_group_is_told_keys_revoked_before_the_new_partition_opens(
    cluster: ClusterEndpoints,
) -> None:
    """Seen under load: a group that had consumed and committed a partition up to a
    change's boundary before the change committed (produces are held during the
    barrier, so consumers catch up) got keys_assigned for the new partition but never
    keys_revoked for the old one. Now the owner of the old partition tells it (once),
    and the new partition's records wait until the group acknowledged it."""
    topic, group = unique("caught-up"), unique("group")
    key = _moving_key(1, 1, 2, 0)
    async with running_sidecars(cluster, 2) as sidecars:
        await sidecars[0].create_topic(topic, 1, replication_factor=cluster.replication_factor)
        await sidecars[0].produce(topic, [{"key": key, "value": i} for i in range(3)])
        old = await create_consumer(sidecars[0], group, "old")
        await old.assign((topic, 0))
        await _drain(old, 3)
        status, body = await old.commit()
        assert status == 204, body
        # Caught up and committed: only now does the partition count change.
        await sidecars[1].change_count(topic, 2)
        status, body = await sidecars[1].produce(topic, [{"key": key, "value": 3}])
        assert [e["partition"] for e in body["offsets"]] == [1], body
        new = await create_consumer(sidecars[1], group, "new")
        await new.assign((topic, 1))

        # The old owner is told, with no record to deliver; the new partition waits.
        revoked: list[dict[str, Any]] = []
        deadline = time.monotonic() + 15
        while not revoked:
            assert time.monotonic() < deadline, "keys_revoked was never told"
            records, events = await old.poll(200)
            assert records == []
            revoked = [e for e in events if e["type"] == "keys_revoked"]
            new_records, new_events = await new.poll(100)
            assert (new_records, new_events) == ([], []), "the new partition opened first"
        assert [(e["partition"], e["generation"]) for e in revoked] == [(0, 1)]
        for _ in range(3):
            assert await new.poll(100) == ([], [])
        await old.ack(revoked[0]["event_id"])
        # Told once: acknowledged, it is not told again.
        assert await old.poll(200) == ([], [])

        deadline = time.monotonic() + 15
        while True:
            records, events = await new.poll(200)
            assert records == []
            if events:
                break
            assert time.monotonic() < deadline, "the new partition never opened"
        assert [(e["type"], e["partition"]) for e in events] == [("keys_assigned", 1)]
        await new.ack(events[0]["event_id"])
        got = await _drain(new, 1)
        assert [json.loads(decoded(r)[1] or b"") for r in got] == [3]


async def test_a_caught_up_group_calls_back_keys_revoked_before_keys_assigned(
    cluster: ClusterEndpoints,
) -> None:
    """The same, in callback mode with auto-commit: the callbacks' order is the hand-off."""
    topic, group = unique("caught-up-cb"), unique("group")
    key = _moving_key(1, 1, 2, 0)
    app = CallbackApp()
    await app.start()
    try:
        async with running_sidecars(cluster, 2) as sidecars:
            await sidecars[0].create_topic(topic, 1, replication_factor=cluster.replication_factor)
            await sidecars[0].produce(topic, [{"key": key, "value": i} for i in range(3)])
            options = {"callback_url": app.url, "auto.commit.enable": "true"}
            old = await create_consumer(sidecars[0], group, "old", **options)
            await old.assign((topic, 0))
            await _drain(old, 3)
            status, body = await old.commit()
            assert status == 204, body
            await sidecars[1].change_count(topic, 2)
            await sidecars[1].produce(topic, [{"key": key, "value": 3}])
            new = await create_consumer(sidecars[1], group, "new", **options)
            await new.assign((topic, 1))
            got: list[dict[str, Any]] = []
            deadline = time.monotonic() + 30
            while not got:
                assert time.monotonic() < deadline, f"nothing delivered; calls {app.events}"
                await old.poll(200)
                records, _ = await new.poll(200)
                got += records
            delivered_at = time.monotonic()
        kinds = [(body["type"], body["partition"]) for _, _, body in app.events]
        assert kinds[:2] == [("keys_revoked", 0), ("keys_assigned", 1)], kinds
        assert kinds.count(("keys_revoked", 0)) == 1, kinds
        revoked_done = app.events[0][1]
        assigned_started, assigned_done = app.events[1][0], app.events[1][1]
        assert revoked_done <= assigned_started <= assigned_done <= delivered_at
    finally:
        await app.stop()


async def _records_of(consumer: RestConsumer, want: int, within_s: float = 20) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + within_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"got {len(got)} of {want} records"
        records, _ = await consumer.poll(300)
        got += records
    return got


async def test_a_subscription_is_replaced_by_a_pattern_and_back(
    cluster: ClusterEndpoints,
) -> None:
    prefix = unique("swap")
    first, second = f"{prefix}-a", f"{prefix}-b"
    async with running_sidecars(cluster, 1) as (sidecar,):
        for topic in (first, second):
            await sidecar.create_topic(topic, 1, replication_factor=cluster.replication_factor)
            await sidecar.produce(topic, [{"value": topic}])
        consumer = await create_consumer(sidecar, unique("group"), "c")
        await consumer.subscribe(first)
        status, body = await consumer.call(
            "POST", "/subscription", {"topic_pattern": f"{second}.*"}
        )
        assert status == 204, body
        assert [r["topic"] for r in await _records_of(consumer, 1)] == [second]
        status, body = await consumer.call("GET", "/subscription")
        assert body == {"topics": [second]}
        await consumer.subscribe(first)
        assert [r["topic"] for r in await _records_of(consumer, 1)] == [first]
        # Unsubscribing also ends a manual assignment, as Kafka's unsubscribe does.
        assert (await consumer.call("DELETE", "/subscription"))[0] == 204
        await consumer.assign((second, 0))
        assert (await consumer.call("DELETE", "/subscription"))[0] == 204
        assert (await consumer.call("GET", "/assignments"))[1] == {"partitions": []}
        await consumer.subscribe(second)
        # Assigning nothing is Kafka's unsubscribe: a pattern can follow it.
        assert (await consumer.call("DELETE", "/subscription"))[0] == 204
        await consumer.assign()
        answer = await consumer.call("POST", "/subscription", {"topic_pattern": f"{first}.*"})
        assert answer[0] == 204, answer
        assert [r["topic"] for r in await _records_of(consumer, 1)] == [first]


async def test_positions_before_a_poll_or_with_nothing_assigned_are_4xx_at_once(
    cluster: ClusterEndpoints,
) -> None:
    topic, other = unique("seek"), unique("other")
    async with running_sidecars(cluster, 1) as (sidecar,):
        for name in (topic, other):
            await sidecar.create_topic(name, 2, replication_factor=cluster.replication_factor)
        consumer = await create_consumer(sidecar, unique("group"), "c")
        none: dict[str, Any] = {"partitions": []}
        # A partition that exists but is never this instance's, whenever the group's
        # assignment (which runs in the background after subscribing) lands.
        named = {"partitions": [{"topic": other, "partition": 0}]}
        at = "2024-01-01T00:00:00Z"
        cases: list[tuple[str, object, int, int]] = [
            ("/positions/beginning", none, 409, 40940),  # neither subscribed nor assigned
            ("/positions/end", named, 409, 40940),
        ]
        for suffix, body, status, code in cases:
            answer = await consumer.call("POST", suffix, body)
            assert (answer[0], answer[1]["error_code"]) == (status, code), (suffix, answer)
        await consumer.subscribe(topic)  # before the first poll: maybe nothing assigned yet
        for suffix in ("/positions/beginning", "/positions/end"):
            assert (await consumer.call("POST", suffix, none))[0] == 204
            answer = await consumer.call("POST", suffix, named)
            assert (answer[0], answer[1]["error_code"]) == (400, 40001), answer
        missing = unique("missing")
        for body, status, code in [
            ({"timestamps": [{"topic": missing, "partition": 0, "timestamp": at}]}, 404, 40401),
            ({"offsets": [{"topic": topic, "partition": 9, "offset": 0}]}, 404, 40402),
            ({"offsets": [{"topic": other, "partition": 0, "offset": 0}]}, 400, 40001),
        ]:
            answer = await consumer.call("POST", "/positions", body)
            assert (answer[0], answer[1]["error_code"]) == (status, code), answer
        answer = await consumer.call(
            "POST", "/positions/end", {"partitions": [{"topic": missing, "partition": 0}]}
        )
        assert (answer[0], answer[1]["error_code"]) == (404, 40401), answer
        assert (await consumer.call("DELETE", "/subscription"))[0] == 204
        for partitions, code in [([(missing, 0)], 40401), ([(topic, 2)], 40402)]:
            body = {"partitions": [{"topic": t, "partition": p} for t, p in partitions]}
            answer = await consumer.call("POST", "/assignments", body)
            assert (answer[0], answer[1]["error_code"]) == (404, code), answer
        await consumer.assign((topic, 1))
        answer = await consumer.call(
            "POST",
            "/positions",
            {"timestamps": [{"topic": topic, "partition": 1, "timestamp": at}]},
        )
        assert answer[0] == 204, answer


async def test_records_of_a_response_the_client_never_read_are_delivered_again(
    cluster: ClusterEndpoints,
) -> None:
    """Seen in chaos runs: a client gave up on a long poll (its timeout passed while the
    sidecar was paused), the sidecar then released records into a response nobody read,
    and the group's next commit of everything delivered skipped them for good."""
    topic = unique("abandoned")
    group = unique("group")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 1, replication_factor=cluster.replication_factor)
        consumer = await create_consumer(sidecar, group, "c1")
        await consumer.subscribe(topic)
        status, body = await sidecar.produce(topic, [{"key": "k", "value": 0}])
        assert status == 200, body
        assert [json.loads(decoded(r)[1] or b"") for r in await _drain(consumer, 1)] == [0]

        # A long poll whose client leaves before any record arrives.
        _, writer = await asyncio.open_connection("127.0.0.1", sidecar.server.port)
        writer.write(
            (
                f"GET {consumer.path}/records?timeout=5000 HTTP/1.1\r\n"
                "Host: 127.0.0.1\r\nAccept: application/vnd.kafka.binary.v2+json\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        await asyncio.sleep(0.5)
        writer.close()
        await writer.wait_closed()
        # The records arrive while the abandoned poll still waits, and are released to it.
        status, body = await sidecar.produce(topic, [{"key": "k", "value": i} for i in (1, 2)])
        assert status == 200, body

        got = await _drain(consumer, 2)
        assert [json.loads(decoded(r)[1] or b"") for r in got] == [1, 2]
        status, _ = await consumer.commit()
        assert status == 204
        await consumer.delete()


async def test_record_headers_chooses_which_headers_the_app_reads(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("headers")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        trace = {"name": "trace", "value": "dDE="}
        status, body = await sidecar.produce(
            topic, [{"key": f"k{i}", "value": i, "headers": [trace]} for i in range(6)]
        )
        assert status == 200, body
        names: dict[str | None, list[list[str] | None]] = {}
        for kept in ("all", "app", "none", None):
            chosen = {} if kept is None else {"record_headers": kept}
            consumer = await create_consumer(
                sidecar, unique("group"), "c", **chosen, **{"auto.offset.reset": "earliest"}
            )
            await consumer.subscribe(topic)
            got = await _drain(consumer, 6)
            names[kept] = [
                [h["name"] for h in r["headers"]] if "headers" in r else None for r in got
            ]
            await consumer.delete()
        assert names["all"] == [["trace", "ordered.stamp"]] * 6
        assert names["app"] == [["trace"]] * 6
        assert names["none"] == [None] * 6
        # Unless asked for, the sidecar's own header stays out of the app's records.
        assert names[None] == [["trace"]] * 6
        # A value outside the three is refused at once, and no instance is left behind.
        group = unique("group")
        status, answer = await post_create_consumer(
            sidecar, group, {"name": "x", "record_headers": "internal"}
        )
        assert (status, answer["error_code"]) == (422, 42204), answer
        status, answer = await RestConsumer(sidecar, group, "x").call("GET", "/subscription")
        assert (status, answer["error_code"]) == (404, 40403)
