"""A managed topic simulated in memory: keyed records routed by linear hashing through a
random sequence of expansions and shrinks, with the generation log the barrier would
commit (each boundary is the partition's end at the change). The gate's and the
compaction's property tests run on it."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from sidecar.core.generations import Boundary, GenerationLog, PartitionMode
from sidecar.core.routing import linear_hash_partition


@dataclass
class SimulatedTopic:
    """A topic's records (key, per-key sequence) per partition, and its generation log."""

    initial_count: int
    log: GenerationLog
    partitions: list[list[tuple[int, int]]]
    next_sequence: dict[int, int] = field(default_factory=dict)

    @classmethod
    def create(cls, initial_count: int) -> SimulatedTopic:
        return cls(
            initial_count, GenerationLog.start(initial_count), [[] for _ in range(initial_count)]
        )

    def produce(self, key: int) -> None:
        # The key itself serves as its non-negative hash.
        partition = linear_hash_partition(key, self.initial_count, self.log.current.undeleted_count)
        sequence = self.next_sequence.get(key, 0)
        self.next_sequence[key] = sequence + 1
        self.partitions[partition].append((key, sequence))

    def change_count(self, undeleted_count: int) -> None:
        while len(self.partitions) < undeleted_count:
            self.partitions.append([])
        boundaries = [Boundary(len(records)) for records in self.partitions]
        self.log = self.log.append(self.log.next_generation(undeleted_count, boundaries))


def modes_of(log: GenerationLog) -> list[PartitionMode]:
    """Partitions below the current count read-write, the others read-only."""
    return [
        PartitionMode.READ_WRITE if p < log.current.undeleted_count else PartitionMode.READ_ONLY
        for p in range(log.current.physical_count)
    ]


KEYS = st.integers(0, 63)


def any_count_but(draw: st.DrawFn, initial_count: int, current: int) -> int:
    """A count a change may go to from ``current``: any in [N, 4N+8) but ``current``."""
    target = draw(st.integers(initial_count, 4 * initial_count + 7))
    return target + 1 if target >= current else target


@st.composite
def topics(draw: st.DrawFn) -> SimulatedTopic:
    """A topic of N in 1..4 through 1 to 8 changes, with a few records before each."""
    initial = draw(st.integers(1, 4))
    topic = SimulatedTopic.create(initial)
    for key in draw(st.lists(KEYS, max_size=12)):
        topic.produce(key)
    for _ in range(draw(st.integers(1, 8))):
        topic.change_count(any_count_but(draw, initial, topic.log.current.undeleted_count))
        for key in draw(st.lists(KEYS, max_size=12)):
            topic.produce(key)
    return topic
