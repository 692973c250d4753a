"""The demo's own checks: the per-key order verdict (its exit status) and keys moved."""

from __future__ import annotations

import math

from ordered_dev.demo.summary import check_order, histogram_delta, key_bytes, moves
from sidecar.core.routing import default_partition, partition_for_key


def test_records_in_order_with_duplicates_are_verified() -> None:
    delivered = [("a", 0), ("b", 0), ("a", 1), ("a", 1), ("b", 1), ("a", 2)]
    check = check_order(delivered, {("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)})
    assert check.verified
    assert (check.keys, check.deliveries, check.distinct, check.duplicates) == (2, 6, 5, 1)


def test_a_record_delivered_after_a_later_one_of_its_key_fails_the_check() -> None:
    check = check_order([("a", 0), ("a", 2), ("a", 1)], {("a", 0), ("a", 1), ("a", 2)})
    assert not check.verified
    assert check.late == (("a", 1, 2),)


def test_a_redelivery_of_an_older_record_is_a_duplicate_not_a_reordering() -> None:
    check = check_order([("a", 0), ("a", 1), ("a", 0), ("a", 1), ("a", 2)], set())
    assert check.verified
    assert check.duplicates == 2


def test_an_acknowledged_record_never_delivered_fails_the_check() -> None:
    check = check_order([("a", 0), ("a", 2)], {("a", 0), ("a", 1), ("a", 2)})
    assert not check.verified
    assert check.lost == 1


def test_a_gap_of_a_record_never_acknowledged_is_allowed() -> None:
    # A refused request leaves its sequence numbers unused.
    assert check_order([("a", 0), ("a", 2)], {("a", 0), ("a", 2)}).verified


def test_moves_are_counted_from_placements_and_compared_with_modulo() -> None:
    keys = [f"k{i}" for i in range(2000)]
    placement = {
        key: {
            0: partition_for_key(key_bytes(key), 4, 4),
            1: partition_for_key(key_bytes(key), 4, 5),
        }
        for key in keys
    }
    placement["only-before"] = {0: 0}
    found = moves(placement, 0, 4, 5)
    assert found.keys_seen == 2000
    assert set(found.pairs) == {(0, 4)}
    modulo = sum(
        default_partition(key_bytes(k), 4) != default_partition(key_bytes(k), 5) for k in keys
    )
    assert found.modulo_moved == modulo
    assert found.moved < found.modulo_moved


def test_histogram_growth_and_its_longest_bucket() -> None:
    def scrape(counts: dict[str, float]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        labels = {("topic", "t")}
        samples = {
            ("h_bucket", frozenset(labels | {("le", le)})): value for le, value in counts.items()
        }
        samples[("h_count", frozenset(labels))] = counts["+Inf"]
        samples[("h_sum", frozenset(labels))] = counts["+Inf"] * 0.1
        return samples

    before = scrape({"0.1": 1, "0.5": 1, "1.0": 1, "+Inf": 1})
    after = scrape({"0.1": 3, "0.5": 4, "1.0": 4, "+Inf": 4})
    delta = histogram_delta(before, after, "h", topic="t")
    assert delta.count == 3
    assert delta.longest == 0.5
    assert math.isnan(histogram_delta(after, after, "h", topic="t").longest)
