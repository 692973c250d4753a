from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.compaction import compact
from sidecar.core.generations import Boundary, Generation, GenerationLog, PartitionMode
from sidecar.core.procedures import Operation, OperationKind, Phase, SidecarId
from sidecar.core.serialization import (
    config_from_json,
    config_to_json,
    folded_to_json,
    generation_from_json,
    generation_to_json,
    log_from_generations,
    modes_from_json,
    modes_to_json,
    operation_from_json,
    operation_to_json,
)
from sidecar.core.topics import TopicConfig
from tests.support.simulated_topic import SimulatedTopic, topics

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


def test_a_log_stored_before_compaction_begins_at_generation_zero() -> None:
    first = Generation(0, 2, (Boundary(0), Boundary(0)))
    grown = Generation(1, 3, (Boundary(5), Boundary(5), Boundary(0)))
    log = log_from_generations(2, [first, grown])
    assert log.first_number == 0
    assert log.folded_waits == ()
    assert log_from_generations(2, [first, grown], _through_json(folded_to_json(log))) == log  # type: ignore[arg-type]


@given(topic=topics(), data=st.data())
def test_compacted_logs_round_trip(topic: SimulatedTopic, data: st.DataObject) -> None:
    log = compact(topic.log, data.draw(st.integers(0, topic.log.current.number)))
    stored = [generation_from_json(_through_json(generation_to_json(g))) for g in log.generations]  # type: ignore[arg-type]
    folded = _through_json(folded_to_json(log))
    assert log_from_generations(log.initial_count, stored, folded) == log  # type: ignore[arg-type]
    # Generations a fold left behind in the store are left out.
    stored_before = [*topic.log.generations[: log.first_number], *stored]
    assert log_from_generations(log.initial_count, stored_before, folded) == log  # type: ignore[arg-type]


def test_a_compacted_log_is_read_only_with_what_its_folded_generations_left() -> None:
    log = GenerationLog.start(1)
    log = log.append(log.next_generation(2, [Boundary(4), Boundary(0)]))
    log = log.append(log.next_generation(3, [Boundary(6), Boundary(2), Boundary(0)]))
    compacted = compact(log, 2)
    assert compacted.first_number == 2
    with pytest.raises(ValueError, match="no generation 0"):
        log_from_generations(1, list(compacted.generations))
    folded = folded_to_json(compacted)
    assert folded == {
        "first_generation": 2,
        "waits": [[1, 0, 4, 1, "expansion"], [2, 0, 6, 2, "expansion"]],
    }
    with pytest.raises(ValueError, match="no generation 2"):
        log_from_generations(1, list(log.generations[:2]), folded)


@pytest.mark.parametrize(
    "folded",
    [
        {},
        {"first_generation": 2},
        {"first_generation": "2", "waits": []},
        {"first_generation": 2, "waits": [[1, 0, 4, 1]]},
        {"first_generation": 2, "waits": [[1, 0, 4, 1, "sideways"]]},
        {"first_generation": 2, "waits": [[1, 0, True, 1, "expansion"]]},
    ],
)
def test_malformed_folded_generations_are_value_errors(folded: dict[str, object]) -> None:
    log = GenerationLog.start(1)
    log = log.append(log.next_generation(2, [Boundary(4), Boundary(0)]))
    log = log.append(log.next_generation(3, [Boundary(6), Boundary(2), Boundary(0)]))
    with pytest.raises(ValueError, match="malformed folded generations"):
        log_from_generations(1, list(log.generations), folded)


def test_folded_waits_that_do_not_fit_the_first_generation_are_refused() -> None:
    log = GenerationLog.start(1)
    log = log.append(log.next_generation(2, [Boundary(4), Boundary(0)]))
    above = {"first_generation": 1, "waits": [[1, 0, 5, 1, "expansion"]]}
    with pytest.raises(ValueError, match="does not fit"):
        log_from_generations(1, list(log.generations), above)
    at_zero = {"first_generation": 0, "waits": [[1, 0, 0, 1, "expansion"]]}
    with pytest.raises(ValueError, match="generation 0"):
        log_from_generations(1, list(log.generations), at_zero)
