"""The REST Proxy v2 answers about consumer instances
(``sidecar.http.consumer_response_codec``): the created instance and its URL, the
subscription, the assignments and the committed offsets."""

from __future__ import annotations

import pytest

from sidecar.http.consumer_response_codec import (
    CommittedOffset,
    assignments_body,
    committed_offsets_body,
    consumer_instance_uri,
    create_consumer_body,
    subscription_body,
)
from sidecar.http.records_codec import PartitionRef, encode_response


def test_create_response_is_rest_proxy_shape() -> None:
    created = create_consumer_body("c1", base_url="http://127.0.0.1:8082/", group="billing")
    assert encode_response(created) == (
        b'{"instance_id":"c1","base_uri":"http://127.0.0.1:8082/consumers/billing/instances/c1"}'
    )


@pytest.mark.parametrize(
    ("base_url", "group", "expected"),
    [
        ("http://localhost:8082", "g", "http://localhost:8082/consumers/g/instances/c"),
        ("http://h/prefix/", "g", "http://h/prefix/consumers/g/instances/c"),
        ("http://h", "my group/1", "http://h/consumers/my%20group%2F1/instances/c"),
        ("http://h", "ü?#", "http://h/consumers/%C3%BC%3F%23/instances/c"),
    ],
)
def test_instance_uri_encodes_path_segments(base_url: str, group: str, expected: str) -> None:
    assert consumer_instance_uri(base_url, group, "c") == expected


def test_subscription_response() -> None:
    assert encode_response(subscription_body(["a", "b"])) == b'{"topics":["a","b"]}'


def test_the_subscription_lists_its_topics_in_the_order_given() -> None:
    assert subscription_body(["b", "a"]) == {"topics": ["b", "a"]}
    assert subscription_body([]) == {"topics": []}


def test_assignments_list_each_partition_as_topic_and_number_in_order() -> None:
    partitions = [PartitionRef("b", 3), PartitionRef("a", 0), PartitionRef("a", 2**31 - 1)]
    assert assignments_body(partitions) == {
        "partitions": [
            {"topic": "b", "partition": 3},
            {"topic": "a", "partition": 0},
            {"topic": "a", "partition": 2**31 - 1},
        ]
    }
    assert encode_response(assignments_body([])) == b'{"partitions":[]}'


def test_committed_offsets_are_answered_as_kafka_stores_them() -> None:
    # Kafka stores the next offset to read and the commit's metadata as given; both are
    # answered unchanged (no "last processed" arithmetic on the way out).
    offsets = [CommittedOffset("a", 0, 42, "batch-7"), CommittedOffset("b", 5, 0, "")]
    assert committed_offsets_body(offsets) == {
        "offsets": [
            {"topic": "a", "partition": 0, "offset": 42, "metadata": "batch-7"},
            {"topic": "b", "partition": 5, "offset": 0, "metadata": ""},
        ]
    }
    assert encode_response(committed_offsets_body([])) == b'{"offsets":[]}'


def test_an_instance_id_is_encoded_as_a_path_segment_too() -> None:
    assert consumer_instance_uri("http://h", "g", "a/b c") == (
        "http://h/consumers/g/instances/a%2Fb%20c"
    )
