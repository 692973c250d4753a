"""JSON shapes of the shared metadata (stored in ZooKeeper, shown by the admin API).

Plain dicts of str, int, float, bool, None and lists, so every value round-trips
through ``json`` unchanged. Each ``*_from_json`` raises ValueError on a malformed
value (a missing key, a wrong type), never KeyError or TypeError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sidecar.core.generations import (
    Boundary,
    ChangeKind,
    FoldedWait,
    Generation,
    GenerationLog,
    PartitionMode,
)
from sidecar.core.procedures import Operation, OperationKind, Phase, SidecarId, TransactionalId
from sidecar.core.topics import PendingBarrier, TopicConfig

_T = TypeVar("_T")
Json = dict[str, Any]


def config_to_json(config: TopicConfig) -> Json:
    return {
        "name": config.name,
        "initial_count": config.initial_count,
        "replication_factor": config.replication_factor,
        "compacted": config.compacted,
        "ordered_delivery": config.ordered_delivery,
    }


def config_from_json(raw: Mapping[str, Any]) -> TopicConfig:
    return _parsing(
        "topic config",
        lambda: TopicConfig(
            name=_typed(raw["name"], str),
            initial_count=_typed(raw["initial_count"], int),
            replication_factor=_typed(raw["replication_factor"], int),
            compacted=_typed(raw["compacted"], bool),
            ordered_delivery=_typed(raw["ordered_delivery"], bool),
        ),
    )


def generation_to_json(generation: Generation) -> Json:
    return {
        "number": generation.number,
        "undeleted_count": generation.undeleted_count,
        "boundaries": [[b.offset, b.leader_epoch] for b in generation.boundaries],
    }


def generation_from_json(raw: Mapping[str, Any]) -> Generation:
    return _parsing(
        "generation",
        lambda: Generation(
            number=_typed(raw["number"], int),
            undeleted_count=_typed(raw["undeleted_count"], int),
            boundaries=tuple(_boundary(item) for item in _typed(raw["boundaries"], list)),
        ),
    )


def folded_to_json(log: GenerationLog) -> Json:
    """What a compacted log keeps of its folded generations (``sidecar.core.compaction``):
    the number it begins at, and the waits they leave. Stored beside its generations."""
    return {
        "first_generation": log.first_number,
        "waits": [
            [w.partition, w.source, w.boundary, w.generation, w.kind.value]
            for w in log.folded_waits
        ],
    }


def log_from_generations(
    initial_count: int, generations: list[Generation], folded: Mapping[str, Any] | None = None
) -> GenerationLog:
    """Rebuild a log from stored generations and, for a compacted log, what
    ``folded_to_json`` stored of its folded ones, checking every invariant again.

    Without ``folded`` (every log stored before compaction existed) the log begins at
    generation 0. A stored generation older than the first kept one is left out: it was
    folded, and the folded waits stand for it. Raises ValueError if the generations do
    not make a log from there, or ``folded`` is malformed.
    """
    first, waits = (0, ()) if folded is None else _folded(folded)
    ordered = sorted((g for g in generations if g.number >= first), key=lambda g: g.number)
    if not ordered or ordered[0].number != first:
        raise ValueError(f"the stored generation log has no generation {first}")
    if first == 0 and not waits:
        log = GenerationLog.start(initial_count, ordered[0].boundaries)
    else:
        log = GenerationLog.after_fold(initial_count, ordered[0], waits)
    for generation in ordered[1:]:
        log = log.append(generation)
    return log


def _folded(raw: Mapping[str, Any]) -> tuple[int, tuple[FoldedWait, ...]]:
    def build() -> tuple[int, tuple[FoldedWait, ...]]:
        waits = []
        for item in _typed(raw["waits"], list):
            partition, source, boundary, generation, kind = _typed(item, list)
            waits.append(
                FoldedWait(
                    _typed(partition, int),
                    _typed(source, int),
                    _typed(boundary, int),
                    _typed(generation, int),
                    ChangeKind(kind),
                )
            )
        return _typed(raw["first_generation"], int), tuple(waits)

    return _parsing("folded generations", build)


def modes_to_json(modes: tuple[PartitionMode, ...]) -> list[str]:
    return [mode.value for mode in modes]


def modes_from_json(raw: Any) -> tuple[PartitionMode, ...]:
    return _parsing("partition modes", lambda: tuple(PartitionMode(m) for m in _typed(raw, list)))


def pending_to_json(pending: PendingBarrier) -> Json:
    return {"generation": pending.generation, "target_count": pending.target_count}


def pending_from_json(raw: Mapping[str, Any]) -> PendingBarrier:
    return _parsing(
        "pending barrier",
        lambda: PendingBarrier(
            generation=_typed(raw["generation"], int),
            target_count=_typed(raw["target_count"], int),
        ),
    )


def operation_to_json(operation: Operation) -> Json:
    return {
        "topic": operation.topic,
        "kind": operation.kind.value,
        "from_generation": operation.from_generation,
        "from_count": operation.from_count,
        "target_count": operation.target_count,
        "phase": operation.phase.value,
        "coordinator": operation.coordinator,
        "started_at": operation.started_at,
        "barrier_deadline": operation.barrier_deadline,
        "physical_count": operation.physical_count,
        "previous_boundaries": list(operation.previous_boundaries),
        "acked_floor": list(operation.acked_floor),
        "fenced": list(operation.fenced),
        "boundaries": [[b.offset, b.leader_epoch] for b in operation.boundaries],
        "delete_after_seconds": operation.delete_after_seconds,
        "outcome": operation.outcome,
    }


def operation_from_json(raw: Mapping[str, Any]) -> Operation:
    def build() -> Operation:
        delete_after = raw["delete_after_seconds"]
        return Operation(
            topic=_typed(raw["topic"], str),
            kind=OperationKind(raw["kind"]),
            from_generation=_typed(raw["from_generation"], int),
            from_count=_typed(raw["from_count"], int),
            target_count=_typed(raw["target_count"], int),
            phase=Phase(raw["phase"]),
            coordinator=SidecarId(_typed(raw["coordinator"], str)),
            started_at=_number(raw["started_at"]),
            barrier_deadline=_number(raw["barrier_deadline"]),
            physical_count=_typed(raw["physical_count"], int),
            previous_boundaries=tuple(_typed(x, int) for x in raw["previous_boundaries"]),
            acked_floor=tuple(_typed(x, int) for x in raw["acked_floor"]),
            # Absent from journals written before fencing existed.
            fenced=tuple(TransactionalId(_typed(x, str)) for x in raw.get("fenced", [])),
            boundaries=tuple(_boundary(item) for item in raw["boundaries"]),
            delete_after_seconds=None if delete_after is None else _number(delete_after),
            outcome=_typed(raw["outcome"], str),
        )

    return _parsing("operation", build)


def _boundary(item: Any) -> Boundary:
    offset, epoch = _typed(item, list)
    return Boundary(_typed(offset, int), None if epoch is None else _typed(epoch, int))


def _typed(value: Any, expected: type[_T]) -> _T:
    # bool is an int subclass: a count of `true` is as wrong as a count of "3".
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ValueError(f"expected {expected.__name__}, got {value!r}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _parsing(what: str, build: Callable[[], _T]) -> _T:
    try:
        return build()
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed {what}: {exc}") from exc
