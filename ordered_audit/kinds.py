"""The anomaly kinds and the anomaly row's fields, without Spark: shared by the batch
checks (``ordered_audit.checks``, DataFrames) and the live audit's checks
(``ordered_audit.live_checks``, plain Python). See ``checks`` for what each kind means."""

from __future__ import annotations

LOST = "lost"
DUPLICATE = "duplicate"
NONMONOTONIC = "nonmonotonic"
WRITTEN_ACROSS_BARRIER = "written_across_barrier"
GATE_EVIDENCE = "gate_evidence"
UNAUDITED_DELIVERY = "unaudited_delivery"
CONSUMER_TRUNCATED = "consumer_truncated"
KINDS = (
    LOST,
    DUPLICATE,
    NONMONOTONIC,
    WRITTEN_ACROSS_BARRIER,
    GATE_EVIDENCE,
    UNAUDITED_DELIVERY,
    CONSUMER_TRUNCATED,
)

ANOMALY_FIELDS = (
    "kind",
    "detail",
    "topic",
    "group",
    "producer",
    "key",
    "partition",
    "offset",
    "generation",
    "producer_seq",
    "time",
    "sidecar",
    "instance",
)
"""An anomaly row's fields, in order (``checks.ANOMALY_SCHEMA``'s columns)."""
