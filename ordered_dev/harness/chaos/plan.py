"""The chaos run's settings and its seeded schedule of changes and faults. Pure.

The schedule is drawn from the seed alone, so the same seed gives the same schedule:
the same sequence of changes (delay after the previous one, topic, coordinating sidecar,
target count, HTTP or CLI) and of faults (quiet gap before it, kind, target, duration).
How long each step takes at run time (a barrier waiting for an expired session, a broker
that restarts slowly) varies: a fault's gap is counted from the end of the previous
fault, a change's delay from the start of the previous change.

Changes and faults come from two separate random streams: a run that does fewer changes
(they took longer) still gets exactly the same faults.

Faults come in rounds: each round is every configured kind once, shuffled, so a run of
``r`` rounds has every kind ``r`` times, and a long run has them in even numbers.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    SIDECAR_KILL = "sidecar_kill"
    """SIGKILL of a sidecar process, restarted after a moment (a new process and id)."""
    SIDECAR_PAUSE = "sidecar_pause"
    """SIGSTOP of a sidecar longer than its ZooKeeper session timeout, then SIGCONT:
    a zombie that resumes with sends it admitted before its session expired."""
    CONSUMER_RECREATE = "consumer_recreate"
    """DELETE of a consumer instance and its creation again (same name)."""
    ZOOKEEPER_PAUSE = "zookeeper_pause"
    """SIGSTOP of the ZooKeeper server, then SIGCONT."""
    BROKER_KILL = "broker_kill"
    """SIGKILL of a Kafka broker, restarted after a moment."""
    CALLBACK_REFUSAL = "callback_refusal"
    """Every callback endpoint of the callback-mode group answers 503 for a while."""


ALL_FAULTS: tuple[FaultKind, ...] = tuple(FaultKind)


class ChangeVia(StrEnum):
    HTTP = "http"
    """``POST /admin/topics/{t}/partition-count``."""
    CLI = "cli"
    """``sidecar topics expand|shrink``, which calls the same API."""


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """Everything a chaos run is made of; ``seed`` alone decides the schedule."""

    seed: int
    load_s: float | None = None
    """Length of the load phase; None: as long as ``fault_rounds`` rounds of faults take."""
    fault_rounds: int | None = None
    """Rounds of faults (every kind once per round); None: until ``load_s`` is over."""
    fault_kinds: tuple[FaultKind, ...] = ALL_FAULTS
    sidecars: int = 3
    brokers: int = 3
    initial_count: int = 2
    largest_count: int = 12
    producers: int = 6
    keys_per_producer: int = 4
    """Keys of each producer; each request carries one record per key."""
    produce_pause_s: float = 0.1
    """Pause of each producer between two requests (one request at a time)."""
    change_every_s: tuple[float, float] = (3.0, 8.0)
    cli_share: float = 0.3
    """Fraction of changes made with ``sidecar topics expand|shrink`` instead of HTTP."""
    fault_gap_s: tuple[float, float] = (4.0, 10.0)
    """Quiet time between the end of a fault and the start of the next."""
    sidecar_down_s: tuple[float, float] = (1.0, 3.0)
    zombie_beyond_session_s: tuple[float, float] = (2.0, 6.0)
    """A paused sidecar stays stopped for its session timeout plus this much."""
    zookeeper_pause_s: tuple[float, float] = (12.0, 16.0)
    broker_down_s: tuple[float, float] = (3.0, 8.0)
    callback_refusal_s: tuple[float, float] = (3.0, 6.0)
    # The sidecars' timing settings, shown in the report.
    session_timeout_s: float = 10.0
    """ZooKeeper session timeout of every sidecar."""
    request_timeout_ms: int = 6000
    """Kafka request timeout of every sidecar: with the replication time it must stay
    below the session timeout (the zombie argument of DESIGN §5 rests on it)."""
    barrier_timeout_s: float = 20.0
    hold_timeout_s: float = 30.0
    transaction_lanes: int | None = None
    """``kafka.transaction_lanes`` of every sidecar; None: the sidecar's default."""
    compaction_interval_s: float | None = None
    """``changes.compaction_interval_s`` of every sidecar; None: the sidecar's default."""
    trim_every_s: float = 0.0
    """How often the harness deletes the delete topic's records below what both groups
    committed (DeleteRecords, as retention would, after reading them for the checks), so
    that compaction finds generations to fold; 0: never."""
    look_every_s: float = 1.0
    """How often the harness reads each topic's generation log (``KeptLog``)."""
    # The checks.
    liveness_bound_s: float = 30.0
    """Every acknowledged record reaches every group this long after the last fault."""
    drain_limit_s: float = 150.0
    """How long the run waits for full delivery after the last fault (to measure it)."""
    lock_leak_s: float = 60.0
    """A change-lock node older than this is a leaked lock (a change lasts at most the
    barrier timeout plus its commit)."""
    final_change_within_s: float = 60.0
    """After the faults, one more change of each topic must be done within this."""
    stale_probe_every_s: float = 2.0
    """How often a produce naming an older generation is sent (it must be fenced)."""
    compaction_wait_s: float = 60.0
    """How long the run waits for the cleaner to compact the compacted topic."""
    # The compacted topic: compaction forced.
    segment_ms: int = 3000
    segment_bytes: int = 1024 * 1024
    min_cleanable_dirty_ratio: float = 0.01

    def __post_init__(self) -> None:
        if self.load_s is None and self.fault_rounds is None:
            raise ValueError("give load_s, fault_rounds or both")
        if not 1 <= self.initial_count < self.largest_count:
            raise ValueError("need 1 <= initial_count < largest_count")
        if not self.fault_kinds:
            raise ValueError("no fault kinds")


@dataclass(frozen=True, slots=True)
class PlannedChange:
    delay_s: float
    """Wait after the previous change started (changes of the two topics run side by
    side; one of a topic whose previous change is still running is skipped)."""
    topic: int
    """Index into the run's topics (0: cleanup.policy delete, 1: compacted)."""
    coordinator: int
    """The sidecar asked first; the next running one if it is down or paused."""
    target: int
    via: ChangeVia


@dataclass(frozen=True, slots=True)
class PlannedFault:
    gap_s: float
    """Quiet time after the previous fault ended."""
    kind: FaultKind
    target: int
    """Sidecar index, broker id, or consumer slot (group * sidecars + instance); 0 if
    the fault has no target (ZooKeeper, callback refusal)."""
    duration_s: float
    """How long the target stays down, paused or refusing."""
    change: tuple[int, int] | None = None
    """(topic, target count) of a change made while the fault lasts: through a running
    sidecar while another is paused (so that a barrier completes without the zombie),
    and while callbacks are refused (so that a hand-off meets the refusals)."""

    def describe(self, sidecars: int) -> str:
        match self.kind:
            case FaultKind.SIDECAR_KILL | FaultKind.SIDECAR_PAUSE:
                return f"{self.kind} sidecar {self.target} for {self.duration_s:.1f} s"
            case FaultKind.BROKER_KILL:
                return f"{self.kind} broker {self.target} for {self.duration_s:.1f} s"
            case FaultKind.CONSUMER_RECREATE:
                group, instance = divmod(self.target, sidecars)
                return f"{self.kind} group {group} instance c{instance}"
            case _:
                return f"{self.kind} for {self.duration_s:.1f} s"


@dataclass(frozen=True)
class Plan:
    config: ChaosConfig
    topics: int = 2

    def changes(self) -> Iterator[PlannedChange]:
        """The change schedule, endless; the run takes as many as its load phase lasts."""
        config = self.config
        rng = random.Random(f"{config.seed}/changes")
        last_target = [config.initial_count] * self.topics
        while True:
            topic = rng.randrange(self.topics)
            choices = [
                c
                for c in range(config.initial_count, config.largest_count + 1)
                if c != last_target[topic]
            ]
            target = rng.choice(choices)
            last_target[topic] = target
            yield PlannedChange(
                delay_s=round(rng.uniform(*config.change_every_s), 3),
                topic=topic,
                coordinator=rng.randrange(config.sidecars),
                target=target,
                via=ChangeVia.CLI if rng.random() < config.cli_share else ChangeVia.HTTP,
            )

    def faults(self) -> Iterator[PlannedFault]:
        """The fault schedule: ``fault_rounds`` rounds, or endless if that is None."""
        config = self.config
        rng = random.Random(f"{config.seed}/faults")
        rounds = 0
        while config.fault_rounds is None or rounds < config.fault_rounds:
            kinds = list(config.fault_kinds)
            rng.shuffle(kinds)
            for kind in kinds:
                yield self._fault(rng, kind)
            rounds += 1

    def _fault(self, rng: random.Random, kind: FaultKind) -> PlannedFault:
        config = self.config
        gap = round(rng.uniform(*config.fault_gap_s), 3)
        match kind:
            case FaultKind.SIDECAR_KILL:
                target, duration = (
                    rng.randrange(config.sidecars),
                    rng.uniform(*config.sidecar_down_s),
                )
            case FaultKind.SIDECAR_PAUSE:
                target = rng.randrange(config.sidecars)
                duration = config.session_timeout_s + rng.uniform(*config.zombie_beyond_session_s)
            case FaultKind.CONSUMER_RECREATE:
                target, duration = rng.randrange(2 * config.sidecars), 0.0
            case FaultKind.ZOOKEEPER_PAUSE:
                target, duration = 0, rng.uniform(*config.zookeeper_pause_s)
            case FaultKind.BROKER_KILL:
                target, duration = (
                    rng.randint(1, config.brokers),
                    rng.uniform(*config.broker_down_s),
                )
            case FaultKind.CALLBACK_REFUSAL:
                target, duration = 0, rng.uniform(*config.callback_refusal_s)
        change = None
        if kind in (FaultKind.SIDECAR_PAUSE, FaultKind.CALLBACK_REFUSAL):
            change = (
                rng.randrange(self.topics),
                rng.randint(config.initial_count, config.largest_count),
            )
        return PlannedFault(gap, kind, target, round(duration, 3), change)
