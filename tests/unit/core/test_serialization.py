from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.generations import Boundary, Generation, PartitionMode
from sidecar.core.procedures import Operation, OperationKind, Phase, SidecarId
from sidecar.core.serialization import (
    config_from_json,
    config_to_json,
    generation_from_json,
    generation_to_json,
    log_from_generations,
    modes_from_json,
    modes_to_json,
    operation_from_json,
    operation_to_json,
)
from sidecar.core.topics import TopicConfig

boundaries = st.lists(
    st.builds(Boundary, st.integers(0, 2**62), st.none() | st.integers(0, 2**31)),
    min_size=1,
    max_size=8,
).map(tuple)


def _through_json(value: object) -> object:
    return json.loads(json.dumps(value))


@given(st.integers(0, 1000), st.integers(1, 100), boundaries)
def test_generations_round_trip(number: int, count: int, marks: tuple[Boundary, ...]) -> None:
    generation = Generation(number, count, marks)
    assert generation_from_json(_through_json(generation_to_json(generation))) == generation  # type: ignore[arg-type]


@given(
    st.builds(
        TopicConfig,
        st.text(min_size=1, max_size=20),
        st.integers(1, 100),
        st.integers(1, 5),
        st.booleans(),
        st.booleans(),
    )
)
def test_configs_round_trip(config: TopicConfig) -> None:
    assert config_from_json(_through_json(config_to_json(config))) == config  # type: ignore[arg-type]


@given(
    st.builds(
        Operation,
        topic=st.text(min_size=1, max_size=10),
        kind=st.sampled_from(OperationKind),
        from_generation=st.integers(0, 100),
        from_count=st.integers(1, 100),
        target_count=st.integers(1, 100),
        phase=st.sampled_from(Phase),
        coordinator=st.text(min_size=1, max_size=10).map(SidecarId),
        started_at=st.floats(0, 2e9),
        barrier_deadline=st.floats(0, 2e9),
        physical_count=st.integers(1, 100),
        previous_boundaries=st.lists(st.integers(0, 10**9), max_size=5).map(tuple),
        acked_floor=st.lists(st.integers(0, 10**9), max_size=5).map(tuple),
        boundaries=boundaries,
        delete_after_seconds=st.none() | st.floats(0, 1e6),
        outcome=st.text(max_size=20),
    )
)
def test_operations_round_trip(operation: Operation) -> None:
    assert operation_from_json(_through_json(operation_to_json(operation))) == operation  # type: ignore[arg-type]


def test_modes_round_trip() -> None:
    modes = (PartitionMode.READ_WRITE, PartitionMode.READ_ONLY, PartitionMode.REMOVED)
    assert modes_from_json(_through_json(modes_to_json(modes))) == modes


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"number": "1", "undeleted_count": 2, "boundaries": [[0, None]]},
        {"number": True, "undeleted_count": 2, "boundaries": [[0, None]]},
        {"number": 1, "undeleted_count": 2, "boundaries": [[0]]},
        {"number": 1, "undeleted_count": 2, "boundaries": "x"},
    ],
)
def test_malformed_generations_are_value_errors(raw: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="malformed generation"):
        generation_from_json(raw)


def test_a_stored_log_is_checked_again() -> None:
    first = Generation(0, 2, (Boundary(0), Boundary(0)))
    grown = Generation(1, 3, (Boundary(5), Boundary(5), Boundary(0)))
    assert log_from_generations(2, [grown, first]).current == grown
    with pytest.raises(ValueError, match="no generation 0"):
        log_from_generations(2, [grown])
    backwards = Generation(2, 2, (Boundary(1), Boundary(5), Boundary(0)))
    with pytest.raises(ValueError, match="moves back"):
        log_from_generations(2, [first, grown, backwards])
