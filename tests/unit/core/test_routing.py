"""Routing core: murmur2 against Kafka's vectors, linear hashing and lineage properties."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.routing import (
    ancestors,
    children,
    default_partition,
    expansion_blocker,
    linear_hash_partition,
    linear_hash_shape,
    murmur2,
    nearest_below,
    parent,
    partition_for_key,
    positive_hash,
    relocations,
    shrink_blockers,
)

# org.apache.kafka.common.utils.UtilsTest#testMurmur2, plus the empty array.
KAFKA_MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"", 275646681),
]

keys = st.binary(min_size=0, max_size=64)
hashes = st.integers(min_value=0, max_value=0x7FFFFFFF)


@st.composite
def counts(draw: st.DrawFn, max_initial: int = 16, max_count: int = 300) -> tuple[int, int]:
    """(N, U) with 1 <= N <= U."""
    initial = draw(st.integers(min_value=1, max_value=max_initial))
    undeleted = draw(st.integers(min_value=initial, max_value=max(initial, max_count)))
    return initial, undeleted


@pytest.mark.parametrize(("data", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka_utils_test_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_default_partition_matches_kafka_known_value() -> None:
    # Utils.toPositive(murmur2("foobar")) % 50 as the Java client computes it.
    assert default_partition(b"foobar", 50) == (-790332482 & 0x7FFFFFFF) % 50 == 16


@given(data=keys)
def test_murmur2_is_a_signed_32_bit_int(data: bytes) -> None:
    assert -(2**31) <= murmur2(data) < 2**31


@given(key=keys, nc=counts())
def test_initial_count_is_kafkas_default_partitioner(key: bytes, nc: tuple[int, int]) -> None:
    initial, _ = nc
    assert partition_for_key(key, initial, initial) == default_partition(key, initial)


@given(h=hashes, nc=counts())
def test_partition_is_nearest_ancestor_of_the_leaf_below_count(h: int, nc: tuple[int, int]) -> None:
    initial, undeleted = nc
    # The key's leaf in a tree deep enough for every count in play.
    leaf = h % (initial << 40)
    expected = nearest_below(leaf, undeleted, initial)
    assert linear_hash_partition(h, initial, undeleted) == expected
    assert 0 <= expected < undeleted


@given(h=hashes, nc=counts())
def test_adding_one_partition_moves_keys_only_from_its_parent_into_it(
    h: int, nc: tuple[int, int]
) -> None:
    initial, undeleted = nc
    before = linear_hash_partition(h, initial, undeleted)
    after = linear_hash_partition(h, initial, undeleted + 1)
    if before != after:
        assert after == undeleted
        assert (
            before == parent(undeleted, initial) == expansion_blocker(undeleted, initial, undeleted)
        )


@given(nc=counts(max_initial=12, max_count=200), seed=st.integers(0, 2**32 - 1))
def test_one_added_partition_moves_the_expected_fraction_of_keys(
    nc: tuple[int, int], seed: int
) -> None:
    initial, undeleted = nc
    shape = linear_hash_shape(initial, undeleted)
    expected = 1 / (shape.round_size * 2)
    rng = random.Random(seed)
    samples = 20_000
    moved = 0
    for _ in range(samples):
        key = rng.getrandbits(64).to_bytes(8, "little")
        h = positive_hash(key)
        if linear_hash_partition(h, initial, undeleted) != linear_hash_partition(
            h, initial, undeleted + 1
        ):
            moved += 1
    sigma = math.sqrt(expected * (1 - expected) / samples)
    # Five standard deviations: a false alarm is about one in a million examples.
    assert abs(moved / samples - expected) <= 5 * sigma + 1 / samples


@given(h=hashes, nc=counts(), data=st.data())
def test_count_change_moves_keys_only_along_their_lineage(
    h: int, nc: tuple[int, int], data: st.DataObject
) -> None:
    initial, old = nc
    new = data.draw(st.integers(min_value=initial, max_value=old + 300))
    before = linear_hash_partition(h, initial, old)
    after = linear_hash_partition(h, initial, new)
    if new >= old:
        assert after == before or before in ancestors(after, initial)
    else:
        assert after == before or after in ancestors(before, initial)
    if before != after:
        assert (before, after) in relocations(initial, old, new)


@given(nc=counts(), data=st.data())
def test_relocations_agree_with_blockers(nc: tuple[int, int], data: st.DataObject) -> None:
    initial, old = nc
    new = data.draw(st.integers(min_value=initial, max_value=old + 100))
    moves = relocations(initial, old, new)
    if new > old:
        assert moves == sorted((expansion_blocker(p, initial, old), p) for p in range(old, new))
        # Every new partition has exactly one blocker, below the old count.
        assert all(source < old for source, _ in moves)
    elif new < old:
        for remaining in range(new):
            sources = [s for s, d in moves if d == remaining]
            assert shrink_blockers(remaining, initial, old, new) == sorted(sources)
    else:
        assert moves == []


@given(nc=counts(max_count=2000), data=st.data())
def test_shrink_blockers_are_logarithmic_for_moderate_shrinks(
    nc: tuple[int, int], data: st.DataObject
) -> None:
    initial, old = nc
    if old == initial:
        return
    new = data.draw(st.integers(min_value=max(initial, (old + 1) // 2), max_value=old - 1))
    bound = math.floor(math.log2(old / initial)) + 1
    for remaining in range(new):
        assert len(shrink_blockers(remaining, initial, old, new)) <= bound


@given(initial=st.integers(1, 16), partition=st.integers(0, 5000))
def test_parent_formula_and_children_are_inverse(initial: int, partition: int) -> None:
    up = parent(partition, initial)
    if partition < initial:
        assert up is None
    else:
        level = math.floor(math.log2(partition / initial))
        assert up == partition - initial * 2**level
        assert up is not None
        assert partition in children(up, initial, partition + 1)
    for child in children(partition, initial, 6000):
        assert parent(child, initial) == partition


def test_linear_hashing_worked_example() -> None:
    # N=3, U=5: L=0, round 3, S=2; partitions 0 and 1 are split into 3 and 4.
    shape = linear_hash_shape(3, 5)
    assert (shape.level, shape.round_size, shape.split_count) == (0, 3, 2)
    assert [linear_hash_partition(h, 3, 5) for h in range(6)] == [0, 1, 2, 3, 4, 2]
    assert parent(4, 3) == 1
    assert parent(7, 3) == 1
    assert parent(13, 3) == 1
    assert list(ancestors(13, 3)) == [1]
    assert list(ancestors(10, 3)) == [4, 1]
    # 4, 7 and 10 are all retired; 10 reaches 1 through retired 4.
    assert shrink_blockers(1, 3, 11, 4) == [4, 7, 10]
    assert shrink_blockers(1, 3, 11, 5) == [7]
    assert shrink_blockers(4, 3, 11, 5) == [10]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: linear_hash_partition(-1, 2, 2), "non-negative"),
        (lambda: linear_hash_partition(1, 2, 1), "below the initial count"),
        (lambda: default_partition(b"k", 0), "at least 1"),
        (lambda: expansion_blocker(1, 2, 4), "not new"),
        (lambda: shrink_blockers(0, 2, 4, 4), "not a shrink"),
        (lambda: shrink_blockers(5, 2, 8, 4), "not below"),
        (lambda: nearest_below(9, 1, 2), "below the initial count"),
    ],
)
def test_invalid_arguments_raise(call: object, message: str) -> None:
    assert callable(call)
    with pytest.raises(ValueError, match=message):
        call()
