"""The admin API's JSON: a managed topic's description and a change's operation.

Its own encoder, apart from the ZooKeeper storage format (``sidecar.core.serialization``):
the two describe the same records today, but either may change without the other.
"""

from __future__ import annotations

from typing import Any

from sidecar.core.generations import Generation
from sidecar.core.procedures import Operation
from sidecar.core.topics import TopicState
from sidecar.core.truncation import TruncatedBoundary
from sidecar.service.admin import TopicDescription


def topic_body(state: TopicState) -> dict[str, Any]:
    """A managed topic: its config, generations, partitions and any change under way."""
    return {
        "config": {
            "name": state.config.name,
            "initial_count": state.config.initial_count,
            "replication_factor": state.config.replication_factor,
            "compacted": state.config.compacted,
            "ordered_delivery": state.config.ordered_delivery,
        },
        "generation": state.current.number,
        "undeleted_count": state.current.undeleted_count,
        "physical_count": len(state.modes),
        "generations": [_generation(g) for g in state.log.generations],
        # A compacted log keeps generations from this one; the older ones were folded
        # (their records are gone) into the waits they still impose.
        "first_generation": state.log.first_number,
        "folded_waits": [
            {
                "partition": w.partition,
                "source": w.source,
                "boundary": w.boundary,
                "generation": w.generation,
                "kind": w.kind.value,
            }
            for w in state.log.folded_waits
        ],
        "partitions": [
            {
                "partition": p,
                "mode": mode.value,
                "delete_after": state.delete_after[p] if p < len(state.delete_after) else None,
            }
            for p, mode in enumerate(state.modes)
        ],
        "pending": None
        if state.pending is None
        else {"generation": state.pending.generation, "target_count": state.pending.target_count},
        "operation": None if state.operation is None else operation_body(state.operation),
    }


def description_body(description: TopicDescription) -> dict[str, Any]:
    """``GET /admin/topics/{topic}``: the topic, and who holds its change lock."""
    lock = description.lock
    return topic_body(description.state) | {
        "lock": None
        if lock is None
        else {"holder": lock.holder, "purpose": lock.purpose, "age_s": lock.age_s}
    }


def operation_body(operation: Operation) -> dict[str, Any]:
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


def _generation(generation: Generation) -> dict[str, Any]:
    return {
        "number": generation.number,
        "undeleted_count": generation.undeleted_count,
        "boundaries": [[b.offset, b.leader_epoch] for b in generation.boundaries],
    }


def truncations_body(topic: str, confirmed: list[TruncatedBoundary]) -> dict[str, Any]:
    """The lost boundaries an operator just confirmed (``POST .../confirm-truncation``)."""
    return {
        "topic": topic,
        "confirmed": [
            {
                "generation": lost.generation,
                "partition": lost.partition,
                "boundary": lost.offset,
                "leader_epoch": lost.leader_epoch,
                "log_end": lost.log_end,
            }
            for lost in confirmed
        ],
    }
