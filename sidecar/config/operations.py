"""The sections of how the sidecar runs and is watched: ``metrics``, ``audit``,
``process``, ``startup``, ``log`` and ``faults`` (fault injection for the crash tests)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Bounds on the Prometheus exposition: topic and group names are the apps' choice,
    and each one would be a series of every labelled metric."""

    max_topic_labels: int = 1000
    """Topics counted under their own name; the others under ``_other``."""
    max_group_labels: int = 100
    """Consumer groups counted under their own name; the others under ``_other``."""


@dataclass(frozen=True, slots=True)
class AuditSettings:
    enabled: bool = False
    topic: str = "ordered-sidecar-audit"
    sample_rate: float = 1.0
    """Fraction of keys whose record events are emitted (chosen by key hash, so a sampled
    key's history is complete); key-less events are always emitted."""
    buffer_size: int = 100_000
    """Events waiting to be sent; beyond it events are dropped and counted, never waited for."""
    batch_size: int = 500
    """Events sent to the audit topic in one batch."""
    partitions: int = 6
    """Partitions of the audit topic when the sidecar creates it."""


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    """The Python process the sidecar runs in."""

    gc_young_threshold: int = 50_000
    """Allocations (net of frees) between two collections of Python's youngest garbage
    generation; Python's default is 700. A consume response builds a few objects per
    record (the record, its header tuples), tens of thousands at a time, and at 700 the
    collector runs, and walks the objects still alive, every few dozen records. Reading
    a managed topic of 100-byte records, 50,000 against 700 on one sidecar each, same
    cluster, alternating: 1.2-1.4x the records/s, and the same RSS (95 MiB after the
    reads, either way). Memory freed by reference counting, nearly all of it, is freed at
    once either way; only reference cycles wait for the collector."""
    event_loop: str = "auto"
    """The asyncio event loop ``sidecar serve`` runs on: ``asyncio`` (the standard
    library's), ``uvloop`` (libuv, a dependency on Linux), or ``auto``: uvloop where it
    is installed, else asyncio. ``bench/ab.py`` measures one against the other: 1.23x
    the managed records/s and 1.33x the unmanaged on uvloop
    (``bench/results/ab-process-event-loop.md``); chaos run 17 ran on it."""


@dataclass(frozen=True, slots=True)
class StartupSettings:
    """How a sidecar waits for Kafka, ZooKeeper and its producers at start."""

    retry_initial_s: float = 0.2
    """The pause after the first failed try; it doubles at each failure after that."""
    retry_max_s: float = 2.0
    """The longest pause between tries (half of it random, so sidecars restarted
    together spread out). A sidecar is ready at most this long after its cluster is."""


LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True, slots=True)
class LogSettings:
    format: str = "text"
    """``text``: one readable line per event; ``json``: one JSON object per line (time,
    level, logger, message, and the exception when there is one), for log collectors."""
    level: str = "INFO"


@dataclass(frozen=True, slots=True)
class FaultSettings:
    """Fault injection for the crash tests; empty in production."""

    kill_after_phase: str = ""
    """SIGKILL this process right after it journals a change entering this phase."""
    withhold_barrier_acks: bool = False
    """Never ack a barrier, as a sidecar whose sends never settle: changes time out."""
    stop_before_commit: int = 0
    """SIGSTOP this process before committing its Nth transaction, once its records were
    appended (0: never): a zombie with an open transaction, for the fencing tests."""
    stop_before_send: int = 0
    """SIGSTOP this process before sending its Nth transaction's records (0: never),
    once: a zombie that routed and stamped them under the generation it knew and sent
    nothing yet, for the audit's test of a write across a barrier."""
    skip_fence: bool = False
    """For tests only: a change this sidecar coordinates drops the ids of sidecars whose
    session is gone without fencing them, so a zombie's writes are not refused: the
    write across a barrier the audit's tests must report."""
    stop_before_compaction_write: bool = False
    """SIGSTOP this process once, when a compaction of a generation log has decided what
    to fold and not written it yet (holding the topic's lock): the compaction fault test."""
    ungated_delivery: bool = False
    """For tests only: this sidecar's consumers deliver every record of every topic as
    soon as it is read, as if no topic were ordered (no gate, no key hand-off): an
    ungated consumer whose broken per-key order the audit's tests must report."""
