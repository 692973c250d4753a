"""Fakes of what the consume path's components are given (``ConsumeContext``): the
group's ZooKeeper records and Kafka offsets, the topic registry, the metrics, the audit
emitter and the group consumer. Each keeps what it was told, for tests to look at."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sidecar.adapters.group_consumer import Fetched
from sidecar.adapters.kafka import OffsetAndEpoch
from sidecar.config import ConsumerSettings
from sidecar.core.consume import TopicPartition
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode
from sidecar.core.placement import RELOCATION_HEADER
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.faults import FaultHooks
from sidecar.service.consume_context import ConsumeContext


@dataclass(frozen=True)
class Record:
    """A consumed record (the ``ConsumedRecord`` shape)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None = b"k"
    value: bytes | None = b"v"
    headers: Sequence[tuple[str, bytes | None]] = ()


def records(topic: str, partition: int, first: int, last: int) -> list[Record]:
    return [Record(topic, partition, offset) for offset in range(first, last + 1)]


def tombstone(topic: str, partition: int, offset: int) -> Record:
    """A relocation tombstone (DESIGN §7)."""
    return Record(topic, partition, offset, value=None, headers=[(RELOCATION_HEADER, b"1")])


def expanded_log(boundary: int) -> GenerationLog:
    """One partition expanded to two: keys of partition 0 moved to partition 1 at
    ``boundary`` of partition 0 (generation 1)."""
    log = GenerationLog.start(1)
    return log.append(log.next_generation(2, [Boundary(boundary), Boundary(0)]))


def runtime(topic: str, log: GenerationLog, *, ordered: bool = True) -> Any:
    modes = tuple(PartitionMode.READ_WRITE for _ in range(log.current.physical_count))
    config = TopicConfig(topic, log.initial_count, 1, ordered_delivery=ordered)
    return SimpleNamespace(name=topic, state=TopicState(config, log, modes))


class Store:
    """The group's keys_revoked acknowledgements and gate waits, as ZooKeeper holds them."""

    def __init__(self) -> None:
        self.groups: list[str] = []
        self.acknowledged: list[tuple[str, str, int, int]] = []
        self.waiting: list[tuple[str, str, int, int, str]] = []

    async def register_group(self, group: str) -> None:
        self.groups.append(group)

    async def acknowledge_revocation(
        self, group: str, topic: str, partition: int, generation: int
    ) -> None:
        self.acknowledged.append((group, topic, partition, generation))

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]:
        return {(p, g) for (gr, t, p, g) in self.acknowledged if (gr, t) == (group, topic)}

    async def add_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None:
        self.waiting.append((group, topic, source, boundary, instance))

    async def remove_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None:
        self.waiting.remove((group, topic, source, boundary, instance))

    async def waits(self, group: str, topic: str) -> dict[int, int]:
        found: dict[int, int] = {}
        for g, t, source, boundary, _ in self.waiting:
            if (g, t) == (group, topic):
                found[source] = max(boundary, found.get(source, 0))
        return found


class Offsets:
    """The group's committed offsets and the partitions' log starts, in Kafka."""

    def __init__(self) -> None:
        self.committed: dict[tuple[str, str], dict[int, int]] = {}
        self.reads = 0

    async def committed_offsets(self, group: str, topic: str, count: int) -> dict[int, int]:
        self.reads += 1
        return dict(self.committed.get((group, topic), {}))

    async def log_start_offsets(self, topic: str, count: int) -> list[int]:
        return [0] * count

    async def epoch_end_offsets(
        self, topic: str, epochs: Mapping[int, int]
    ) -> dict[int, OffsetAndEpoch | None]:
        """No log was cut: every epoch asked about ends past any position."""
        return {partition: OffsetAndEpoch(2**62, epoch) for partition, epoch in epochs.items()}


class Registry:
    def __init__(self, *runtimes: Any) -> None:
        self.topics: dict[str, Any] = {r.name: r for r in runtimes}
        self.refreshed = 0

    async def runtime(self, topic: str) -> Any:
        return self.topics.get(topic)

    async def refresh(self, runtime: Any) -> None:
        self.refreshed += 1


class Metrics:
    def __init__(self) -> None:
        self.delivered_counts: dict[TopicPartition, int] = {}
        self.waiting = 0
        self.lags: dict[TopicPartition, int] = {}
        self.commits = 0
        self.rebalances = 0
        self.rebalance_requests = 0
        self.truncations: list[tuple[TopicPartition, int]] = []

    def delivered(self, tp: TopicPartition, records: Sequence[Any], managed: bool) -> None:
        if records:
            self.delivered_counts[tp] = self.delivered_counts.get(tp, 0) + len(records)

    def gate_waiting(self, topic: str, group: str, delta: int) -> None:
        self.waiting += delta

    def gate_waited(self, topic: str, group: str, kind: object, seconds: float) -> None:
        pass

    def callback_done(self, message: object, seconds: float, ok: bool) -> None:
        pass

    def lag(self, group: str, tp: TopicPartition, records: int) -> None:
        self.lags[tp] = records

    def committed(self, group: str, partitions: Sequence[TopicPartition]) -> None:
        self.commits += len(partitions)

    def rebalanced(self, group: str) -> None:
        self.rebalances += 1

    def truncated(self, group: str, tp: TopicPartition, lost: int) -> None:
        self.truncations.append((tp, lost))

    def rebalance_requested(self, group: str) -> None:
        self.rebalance_requests += 1


class Audit:
    enabled = True

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        self.events.append(event)


@dataclass
class GroupConsumer:
    """The group-consumer adapter: an assignment, fetch positions, commits, seeks."""

    assigned: set[TopicPartition] = field(default_factory=set)
    positions: dict[TopicPartition, int | None] = field(default_factory=dict)
    next_fetch: dict[TopicPartition, list[Record]] = field(default_factory=dict)
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)
    commit_epochs: list[dict[TopicPartition, int | None]] = field(default_factory=list)
    group_committed: dict[TopicPartition, int] = field(default_factory=dict)
    highwaters: dict[TopicPartition, int] = field(default_factory=dict)
    paused: set[TopicPartition] = field(default_factory=set)
    rejoins: int = 0
    stopped: bool = False
    handler: Any = None
    subscribed: tuple[Sequence[str], str | None] | None = None
    incarnations: int = 0
    assignment_seen: frozenset[TopicPartition] | None = None

    def subscribe(self, topics: Sequence[str], pattern: str | None, handler: Any) -> None:
        self.subscribed, self.handler = (list(topics), pattern), handler

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self.assigned = set(partitions)

    def subscription(self) -> set[str]:
        return set(self.subscribed[0]) if self.subscribed else set()

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def request_rejoin(self) -> None:
        self.rejoins += 1

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self.paused |= set(partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self.paused -= set(partitions)

    def incarnation(self) -> int:
        """A new number whenever the assignment changed since last asked (or
        ``new_assignment`` said a rebalance gave the same partitions again)."""
        current = frozenset(self.assigned)
        if current != self.assignment_seen:
            self.assignment_seen = current
            self.incarnations += 1
        return self.incarnations

    def new_assignment(self) -> None:
        self.assignment_seen = None

    async def fetch(self, timeout_ms: int) -> Fetched:
        fetched, self.next_fetch = self.next_fetch, {}
        for tp, batch in fetched.items():
            if batch:
                self.positions[tp] = batch[-1].offset + 1
        positions = {tp: p for tp in self.assigned if (p := self.positions.get(tp)) is not None}
        return Fetched(self.incarnation(), dict(fetched), positions, {})  # type: ignore[arg-type]

    def fetch_position(self, tp: TopicPartition) -> int | None:
        return self.positions.get(tp) if tp in self.assigned else None

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highwaters.get(tp)

    async def commit(
        self, offsets: Mapping[TopicPartition, int], epochs: Mapping[TopicPartition, int | None]
    ) -> None:
        self.commits.append(dict(offsets))
        self.commit_epochs.append(dict(epochs))
        self.group_committed.update(offsets)

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.group_committed.get(tp)

    async def committed_epochs(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndEpoch]:
        """Committed without epochs (as this fake's ``commit`` keeps them)."""
        return {
            tp: OffsetAndEpoch(self.group_committed[tp], None)
            for tp in partitions
            if tp in self.group_committed
        }

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def position(self, tp: TopicPartition) -> int:
        return self.positions.get(tp) or 0

    async def stop(self) -> None:
        self.stopped = True


@dataclass
class Context:
    """A ``ConsumeContext`` of fakes, and the fakes themselves."""

    store: Store = field(default_factory=Store)
    offsets: Offsets = field(default_factory=Offsets)
    registry: Registry = field(default_factory=Registry)
    metrics: Metrics = field(default_factory=Metrics)
    audit: Audit = field(default_factory=Audit)
    consumer: GroupConsumer = field(default_factory=GroupConsumer)
    settings: ConsumerSettings = field(
        default_factory=lambda: ConsumerSettings(gate_recheck_s=0.01, revoke_ack_wait_s=0.2)
    )
    faults: FaultHooks = field(default_factory=FaultHooks)

    def build(self) -> ConsumeContext:
        async def start_consumer(options: Any) -> Any:
            return self.consumer

        def callback_client(url: str, timeout_s: float) -> Any:
            raise AssertionError("no callbacks in these tests")

        fakes: Any = self
        return ConsumeContext(
            sidecar_id="s",
            registry=fakes.registry,
            store=fakes.store,
            offsets=fakes.offsets,
            audit=fakes.audit,
            audit_sample_rate=1.0,
            settings=self.settings,
            metrics=fakes.metrics,
            start_consumer=start_consumer,
            callback_client=callback_client,
            faults=self.faults,
        )
