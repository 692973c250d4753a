"""A simulated topic under retention, and its generation log compacted along the way:
what the compaction property tests (``tests/unit/core/test_compaction.py``) and the
compaction pass's (``tests/unit/service/test_compaction.py``) run on, and the check that
a compacted log decides every remaining record as the full log does."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from sidecar.core.compaction import compact, foldable_count
from sidecar.core.gate import waits_into
from sidecar.core.generations import GenerationLog
from sidecar.core.handoff import is_gated, revocation_points, revocations_due
from sidecar.core.placement import place_record
from tests.support.simulated_topic import KEYS, SimulatedTopic, any_count_but, modes_of


@dataclass
class RetainedTopic:
    """A simulated topic (every record ever written, the full log), where retention has
    moved each partition's log start, and its log as compacted along the way."""

    topic: SimulatedTopic
    log_start: list[int]
    compacted: GenerationLog

    @property
    def full(self) -> GenerationLog:
        return self.topic.log

    @property
    def starts(self) -> dict[int, int]:
        return dict(enumerate(self.log_start))

    def end(self, partition: int) -> int:
        return len(self.topic.partitions[partition])


@st.composite
def retained_topics(draw: st.DrawFn) -> RetainedTopic:
    """As ``topics()``: a few records before each of 1 to 8 changes and after the last;
    after each change, maybe retention, then maybe compaction knowing some log starts."""
    initial = draw(st.integers(1, 4))
    topic = SimulatedTopic.create(initial)
    retained = RetainedTopic(topic, [0] * initial, topic.log)
    for _ in range(draw(st.integers(1, 8))):
        for key in draw(st.lists(KEYS, max_size=12)):
            topic.produce(key)
        topic.change_count(any_count_but(draw, initial, topic.log.current.undeleted_count))
        retained.compacted = retained.compacted.append(topic.log.current)
        retained.log_start += [0] * (len(topic.partitions) - len(retained.log_start))
        if draw(st.booleans()):
            retain(draw, retained)
        if draw(st.booleans()):
            everywhere = set(range(len(retained.log_start)))
            known = draw(st.just(everywhere) | st.sets(st.sampled_from(sorted(everywhere))))
            starts = {p: retained.log_start[p] for p in known}
            first = foldable_count(retained.compacted, starts, groups=())
            retained.compacted = compact(retained.compacted, first)
    for key in draw(st.lists(KEYS, max_size=12)):
        topic.produce(key)
    retain(draw, retained)
    return retained


def retain(draw: st.DrawFn, retained: RetainedTopic) -> None:
    """Retention moves log starts forward, never past a partition's end; often to the
    end (everything written was removed), where folding begins."""
    retained.log_start = [
        draw(st.just(len(records)) | st.integers(start, len(records)))
        for start, records in zip(retained.log_start, retained.topic.partitions, strict=True)
    ]


def assert_same_decisions(retained: RetainedTopic, compacted: GenerationLog) -> None:
    """Every decision about a record at or above its log start, and about records
    written later, is the same with ``compacted`` as with the full log."""
    full = retained.full
    first = compacted.first_number
    # Routing: the same current generation, so the same partition for every key.
    assert compacted.current == full.current
    assert compacted.initial_count == full.initial_count
    modes = modes_of(full)
    for key in range(64):
        placed = place_record(
            log=full, modes=modes, key=bytes([key]), explicit_partition=None, unkeyed_index=key
        )
        assert placed == place_record(
            log=compacted, modes=modes, key=bytes([key]), explicit_partition=None, unkeyed_index=key
        )
    for partition in range(full.current.physical_count):
        start, end = retained.log_start[partition], retained.end(partition)
        for offset in range(start, end + 2):
            assert compacted.generation_span(partition, offset) == full.generation_span(
                partition, offset
            )
        # The gate: every generation the compacted log keeps (those of every record
        # at or above the log start, and more).
        for generation in range(first, full.current.number + 1):
            assert waits_into(compacted, partition, generation) == waits_into(
                full, partition, generation
            )
            assert is_gated(compacted, partition, generation) == is_gated(
                full, partition, generation
            )
        # Hand-off: the kept changes' revocations, which hold every one above the log start.
        points = revocation_points(full, partition)
        assert revocation_points(compacted, partition) == tuple(
            r for r in points if r.generation > first
        )
        assert all(r.generation > first for r in points if r.boundary > start)
        for delivered in range(start, end + 1):
            assert revocations_due(compacted, partition, delivered, set()) == [
                r
                for r in revocations_due(full, partition, delivered, set())
                if r.generation > first
            ]
