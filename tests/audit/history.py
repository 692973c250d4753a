"""Hand-built audit histories: a clean one, and the edits that inject each anomaly.

``History`` stamps events the way the sidecars do (per-sidecar ``seq`` from 0, a clock
that moves forward) with the builders of ``sidecar.audit.events``, and keeps Kafka's
side of the story (next offset per partition, each sidecar's record sequence).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.audit import events as audit_events
from sidecar.audit.events import Event
from sidecar.core.placement import sidecar_headers
from sidecar.core.routing import partition_for_key

TOPIC = "orders"
GROUP = "billing"
PRODUCER = "producer-sc"
CONSUMER = "consumer-sc"
INITIAL = 2


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes
    generation: int
    count: int
    producer: str
    producer_seq: int

    @property
    def key_b64(self) -> str:
        return base64.b64encode(self.key).decode()

    def headers(self) -> list[tuple[str, bytes | None]]:
        return sidecar_headers(self.generation, self.count, self.producer, self.producer_seq)


@dataclass
class History:
    events: list[Event] = field(default_factory=list)
    now: float = 1_800_000_000.0
    _seq: dict[str, int] = field(default_factory=dict)
    _next_offset: dict[int, int] = field(default_factory=dict)
    _producer_seq: dict[str, int] = field(default_factory=dict)

    def emit(self, sidecar: str, event: Event) -> Event:
        self.now += 0.01
        seq = self._seq.get(sidecar, 0)
        self._seq[sidecar] = seq + 1
        stamped = audit_events.stamped(event, sidecar=sidecar, seq=seq, now=self.now)
        self.events.append(stamped)
        return stamped

    def restart(self, sidecar: str) -> None:
        """The sidecar process restarts: its audit sequence starts again from 0."""
        self._seq[sidecar] = 0

    def produce(self, key: bytes, generation: int, count: int, producer: str = PRODUCER) -> Record:
        partition = partition_for_key(key, INITIAL, count)
        return self.write(partition, key, generation, count, producer)

    def write(
        self, partition: int, key: bytes, generation: int, count: int, producer: str = PRODUCER
    ) -> Record:
        """A produce_acked at ``partition``'s next offset, wherever the key belongs."""
        offset = self._next_offset.get(partition, 0)
        self._next_offset[partition] = offset + 1
        producer_seq = self._producer_seq.get(producer, 0)
        self._producer_seq[producer] = producer_seq + 1
        record = Record(partition, offset, key, generation, count, producer, producer_seq)
        self.emit(
            producer,
            audit_events.produce_acked(
                topic=TOPIC,
                partition=partition,
                offset=offset,
                key=key,
                generation=generation,
                count=count,
                producer=producer,
                producer_seq=producer_seq,
            ),
        )
        return record

    def bypass(self, partition: int, key: bytes) -> int:
        """A record written without the sidecar (no event, no headers); its offset."""
        offset = self._next_offset.get(partition, 0)
        self._next_offset[partition] = offset + 1
        return offset

    def end_offset(self, partition: int) -> int:
        return self._next_offset.get(partition, 0)

    def deliver(
        self,
        record: Record,
        *,
        group: str = GROUP,
        instance: str = "c1",
        sidecar: str = CONSUMER,
        ordered: bool | None = True,
        assignment: int | None = None,
    ) -> None:
        """``ordered`` None: the event of an older sidecar, without the field;
        ``assignment``: the instance's assignment (None: not said)."""
        event = audit_events.delivered(
            group=group,
            instance=instance,
            topic=TOPIC,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            headers=record.headers(),
            ordered=bool(ordered),
            assignment=assignment,
        )
        if ordered is None:
            del event["ordered"]
        self.emit(sidecar, event)

    def deliver_bare(
        self, partition: int, offset: int, key: bytes, *, group: str = GROUP, instance: str = "c1"
    ) -> None:
        self.emit(
            CONSUMER,
            audit_events.delivered(
                group=group,
                instance=instance,
                topic=TOPIC,
                partition=partition,
                offset=offset,
                key=key,
                headers=[],
            ),
        )

    def commit(self, partition: int, offset: int, *, instance: str = "c1") -> None:
        self.emit(
            CONSUMER,
            audit_events.committed(
                group=GROUP, instance=instance, topic=TOPIC, partition=partition, offset=offset
            ),
        )

    def gate(
        self,
        partition: int,
        offset: int,
        generation: int,
        source: int,
        boundary: int,
        committed: int | None,
        *,
        log_start: int | None = 0,
        mode: str | None = "read_write",
    ) -> None:
        evidence = [
            {
                "source": source,
                "boundary": boundary,
                "committed": committed,
                "log_start": log_start,
                "mode": mode,
            }
        ]
        self.emit(
            CONSUMER,
            audit_events.gate_opened(
                group=GROUP,
                instance="c1",
                topic=TOPIC,
                partition=partition,
                offset=offset,
                generation=generation,
                evidence=evidence,
            ),
        )

    def change(
        self,
        kind: str,
        from_generation: int,
        from_count: int,
        target_count: int,
        *,
        result: str = "done",
        admin: bool = True,
    ) -> None:
        phases = ["barrier", "reading_boundaries", "committing", "done"]
        if kind == "expand":
            phases.insert(0, "creating_partitions")
        if result == "rolled_back":
            phases = [*phases[: phases.index("barrier") + 1], "rolling_back", "rolled_back"]
        for phase in phases:
            self.emit(
                PRODUCER,
                audit_events.barrier_phase(
                    topic=TOPIC,
                    kind=kind,
                    from_generation=from_generation,
                    from_count=from_count,
                    target_count=target_count,
                    phase=phase,
                    coordinator=PRODUCER,
                ),
            )
        if admin:
            self.emit(
                PRODUCER,
                audit_events.admin(
                    topic=TOPIC,
                    kind=kind,
                    result=result,
                    from_count=from_count,
                    target_count=target_count,
                ),
            )


KEYS = [f"key-{i}".encode() for i in range(12)]


@dataclass
class Scenario:
    """A topic of 2 partitions expanded to 3; every key written before and after."""

    history: History
    before: list[Record]
    after: list[Record]
    boundary: int
    """Partition 0's boundary of generation 1 (its end offset when 1 was committed)."""

    @property
    def moved_keys(self) -> set[bytes]:
        """Keys written to partition 0 in generation 0 and partition 2 in generation 1."""
        return {r.key for r in self.after if r.partition == 2}


def written() -> Scenario:
    """The producer side of the clean history: create, 2 records a key, expand 2 -> 3,
    2 records a key. Nothing delivered yet."""
    history = History()
    history.emit(
        PRODUCER,
        audit_events.admin(topic=TOPIC, kind="create", result="done", from_count=0, target_count=2),
    )
    before = [history.produce(key, 0, 2) for _ in range(2) for key in KEYS]
    boundary = history.end_offset(0)
    history.change("expand", 0, 2, 3)
    after = [history.produce(key, 1, 3) for _ in range(2) for key in KEYS]
    scenario = Scenario(history, before, after, boundary)
    assert scenario.moved_keys, "no key moved to partition 2: pick other keys"
    assert any(r.partition == 0 for r in after), "no key stayed in partition 0"
    return scenario


def deliver_in_order(scenario: Scenario) -> None:
    """The consumer side, as the gate orders it: partition 0 up to the boundary and
    partition 1, commit 0 at the boundary, the gate opens for 2, then the rest."""
    history = scenario.history
    records = scenario.before + scenario.after
    for record in records:
        if record.partition == 0 and record.offset < scenario.boundary:
            history.deliver(record)
    for record in records:
        if record.partition == 1:
            history.deliver(record)
    history.commit(0, scenario.boundary)
    history.commit(1, history.end_offset(1))
    first_gated = min(r.offset for r in scenario.after if r.partition == 2)
    history.gate(2, first_gated, 1, 0, scenario.boundary, scenario.boundary)
    for record in records:
        if record.partition == 2 or (record.partition == 0 and record.offset >= scenario.boundary):
            history.deliver(record)
    history.commit(0, history.end_offset(0))
    history.commit(2, history.end_offset(2))


def clean() -> Scenario:
    scenario = written()
    deliver_in_order(scenario)
    return scenario


def injected() -> Scenario:
    """The clean history plus one unaudited delivery and one write across a barrier."""
    scenario = clean()
    history = scenario.history
    offset = history.bypass(1, b"rogue")
    history.deliver_bare(1, offset, b"rogue")
    key = next(r.key for r in scenario.before if r.partition == 0)
    history.write(0, key, 0, 2, producer="zombie-sc")
    return scenario


def write_json_lines(history: History, path: Path) -> Path:
    path.write_text("".join(json.dumps(event) + "\n" for event in history.events))
    return path
