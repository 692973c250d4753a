"""The hand-off callback bodies (``sidecar.http.callback_codec``): the fields an app's
callback endpoint reads, as the README documents them."""

from __future__ import annotations

import json

from sidecar.core.consume import TopicPartition
from sidecar.core.handoff import (
    AssignmentCallback,
    AssignmentChange,
    AssignmentNotice,
    HandoffCallback,
    HandoffKind,
    Subject,
    TruncationNotice,
)
from sidecar.http.callback_codec import encode_callback


def test_a_key_hand_off_names_its_partition_and_generation() -> None:
    message = HandoffCallback(HandoffKind.KEYS_REVOKED, "g", "i", Subject("t", 2, 3))
    assert json.loads(encode_callback(message)) == {
        "type": "keys_revoked",
        "group": "g",
        "instance_id": "i",
        "topic": "t",
        "partition": 2,
        "generation": 3,
    }


def test_an_assignment_notice_lists_its_partitions() -> None:
    notice = AssignmentNotice(
        AssignmentChange.PARTITIONS_ASSIGNED, (TopicPartition("t", 0), TopicPartition("u", 1))
    )
    assert json.loads(encode_callback(AssignmentCallback("g", "i", notice))) == {
        "type": "partitions_assigned",
        "group": "g",
        "instance_id": "i",
        "partitions": [{"topic": "t", "partition": 0}, {"topic": "u", "partition": 1}],
    }


def test_a_truncation_notice_names_the_partition_and_where_reading_resumes() -> None:
    notice = TruncationNotice(TopicPartition("t", 1), 10, 1, 7, 3)
    assert json.loads(encode_callback(AssignmentCallback("g", "i", notice))) == {
        "type": "log_truncated",
        "group": "g",
        "instance_id": "i",
        "topic": "t",
        "partition": 1,
        "offset": 7,
        "position": 10,
        "leader_epoch": 1,
        "lost": 3,
    }
