"""The admin API's topic description (``sidecar.http.admin_codec``), field by field."""

from __future__ import annotations

import dataclasses
import json

from ordered_dev.harness.sidecars import log_of_description
from sidecar.core.compaction import compact
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode
from sidecar.core.topics import PendingBarrier, TopicConfig, TopicState
from sidecar.http.admin_codec import description_body, topic_body
from sidecar.service.admin import LockHolding, TopicDescription


def _state() -> TopicState:
    log = GenerationLog.start(1)
    log = log.append(log.next_generation(2, [Boundary(7, 3), Boundary(0)]))
    return TopicState(
        TopicConfig("t", 1, 3),
        log,
        (PartitionMode.READ_WRITE, PartitionMode.READ_ONLY),
        delete_after=(None,),
        pending=PendingBarrier(generation=2, target_count=3),
    )


def test_a_topic_is_described_with_its_generations_and_partitions() -> None:
    assert topic_body(_state()) == {
        "config": {
            "name": "t",
            "initial_count": 1,
            "replication_factor": 3,
            "compacted": False,
            "ordered_delivery": True,
        },
        "generation": 1,
        "undeleted_count": 2,
        "physical_count": 2,
        "generations": [
            {"number": 0, "undeleted_count": 1, "boundaries": [[0, None]]},
            {"number": 1, "undeleted_count": 2, "boundaries": [[7, 3], [0, None]]},
        ],
        "first_generation": 0,
        "folded_waits": [],
        "partitions": [
            {"partition": 0, "mode": "read_write", "delete_after": None},
            {"partition": 1, "mode": "read_only", "delete_after": None},
        ],
        "pending": {"generation": 2, "target_count": 3},
        "operation": None,
    }


def test_the_description_names_the_lock_holder() -> None:
    lock = LockHolding(holder="s1", purpose="expand", age_s=1.5)
    body = description_body(TopicDescription(_state(), lock))
    assert body["lock"] == {"holder": "s1", "purpose": "expand", "age_s": 1.5}
    assert description_body(TopicDescription(_state(), None))["lock"] is None


def test_a_compacted_log_is_described_from_its_first_kept_generation() -> None:
    state = _state()
    shrunk = state.log.append(state.log.next_generation(1, [Boundary(9, 3), Boundary(4)]))
    compacted = compact(shrunk, 2)
    body = topic_body(dataclasses.replace(state, log=compacted))
    assert body["first_generation"] == 2
    assert [g["number"] for g in body["generations"]] == [2]
    # Partition 0's records wait for partition 1 up to the shrink's boundary there.
    shrink = {"partition": 0, "source": 1, "boundary": 4, "generation": 2, "kind": "shrink"}
    assert shrink in body["folded_waits"]
    assert len(body["folded_waits"]) == len(compacted.folded_waits)


def test_a_description_carries_enough_to_rebuild_a_compacted_log() -> None:
    state = _state()
    shrunk = state.log.append(state.log.next_generation(1, [Boundary(9, 3), Boundary(4)]))
    grown = shrunk.append(shrunk.next_generation(2, [Boundary(12), Boundary(4)]))
    for log in (grown, compact(grown, 2), compact(grown, 3)):
        body = json.loads(json.dumps(topic_body(dataclasses.replace(state, log=log))))
        assert log_of_description(body) == log
