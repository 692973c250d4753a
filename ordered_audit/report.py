"""The audit's human outputs: a markdown report with PNG charts, and a Prometheus
textfile. Plain Python over the small collected tables (operations, time buckets, a
sample of anomalies); matplotlib with the Agg backend (no display needed).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ordered_audit.checks import KINDS

Row = Mapping[str, Any]

VIOLATIONS_CHART = "violations.png"
STALLS_CHART = "gate_stalls.png"


def iso(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if value else "0"
    return str(value)


def change_label(operation: Row) -> str:
    return f"{operation['kind']} {operation['from_count']}→{operation['target_count']}"


def render_markdown(
    summary: Mapping[str, Any],
    operations: Sequence[Row],
    buckets: Sequence[Row],
    samples: Sequence[Row],
    charts: Sequence[str],
) -> str:
    """The report: window, anomaly counts, operations, charts, sample anomalies."""
    window = summary["window"]
    anomalies = summary["anomalies"]
    lines = [
        "# Ordering audit",
        "",
        f"- window: {iso(window['start'])} to {iso(window['end'])} "
        f"({_number(window['end'] - window['start'], 1)} s)",
        f"- source: {summary['source']}",
        f"- events: {summary['events']['total']:,} "
        + "("
        + ", ".join(f"{k} {v:,}" for k, v in sorted(summary["events"]["by_type"].items()))
        + ")",
    ]
    if summary["events"]["other_schema"]:
        lines.append(
            f"- events of another schema version, not read: {summary['events']['other_schema']:,}"
        )
    prometheus = summary.get("prometheus")
    lines.append(
        "- Prometheus: "
        + (
            f"{prometheus['url']} ({prometheus['series']} series, step {prometheus['step']} s)"
            if prometheus
            else "not asked (no --prometheus)"
        )
    )
    verdict = (
        "**no anomalies**" if anomalies["total"] == 0 else f"**{anomalies['total']} anomalies**"
    )
    lines += ["", f"## Anomalies: {verdict}", "", "| kind | count |", "| --- | ---: |"]
    lines += [f"| {kind} | {anomalies['by_kind'].get(kind, 0)} |" for kind in KINDS]
    causes = anomalies.get("duplicates_by_cause") or {}
    if causes:
        lines += [
            "",
            "Duplicates by cause: "
            + ", ".join(f"{cause} {count}" for cause, count in sorted(causes.items())),
        ]
    unseen = summary.get("unseen") or []
    if unseen:
        lines += [
            "",
            "Acknowledged records a group had not reached when the window ended (not "
            "anomalies): "
            + ", ".join(f"{u['group']} on {u['topic']}: {u['unseen']}" for u in unseen),
        ]
    lines += ["", "## Partition-count changes", ""]
    if operations:
        lines += [
            "Hold, stall and fenced figures come from Prometheus over each change's period "
            "(its start to the next change of the topic). From the audit events: the "
            "barrier time (first barrier phase to the final phase), the longest gap between "
            "acknowledged produces of the topic overlapping the change (the pause producers "
            "saw, whatever its cause), the moved keys and the violations in the period.",
            "",
            "| topic | change | result | start | duration s | barrier s | ack gap s | "
            "held max | hold p99 s | hold max s | fenced | gated max | stall p99 s | "
            "longest stall s | keys moved | violations |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
            "---: | ---: | ---: | ---: |",
        ]
        for op in operations:
            cells = [
                op["topic"],
                change_label(op),
                op["result"],
                iso(op["start"]),
                _number(op["duration_s"]),
                _number(op["barrier_s"]),
                _number(op.get("ack_gap_s")),
                _number(op.get("held_max"), 0),
                _number(op.get("hold_p99_s")),
                _number(op.get("hold_max_s")),
                _number(op.get("fenced"), 0),
                _number(op.get("gated_max"), 0),
                _number(op.get("gate_wait_p99_s")),
                _number(op.get("gate_wait_max_s")),
                _number(op.get("keys_moved")),
                _number(op.get("violations")),
            ]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines += [
            "",
            '"hold max" and "longest stall" are the upper bounds of the histogram '
            'buckets the longest observations fell in; "held max" and "gated max" are '
            "what the scrapes caught of the gauges.",
        ]
    else:
        lines.append("None in the window.")
    if charts:
        lines += ["", "## Over time", ""]
        lines += [f"![{name}]({name})" for name in charts]
    lines += ["", f"Time buckets: {len(buckets)} (table `buckets/`)."]
    if samples:
        lines += [
            "",
            "## Anomalies (first ones of each kind)",
            "",
            "| kind | time | topic | group | producer | key | partition | offset | "
            "generation | detail |",
            "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | --- |",
        ]
        for row in samples:
            cells = [
                row["kind"],
                iso(row["time"]),
                row["topic"],
                row["group"],
                row["producer"],
                row["key"],
                row["partition"],
                row["offset"],
                row["generation"],
                row["detail"],
            ]
            lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    lines += [
        "",
        "Tables (Parquet): `anomalies/`, `operations/`, `buckets/`; summary: `summary.json`.",
        "",
    ]
    return "\n".join(lines)


def draw_charts(
    out: Path, buckets: Sequence[Row], operations: Sequence[Row], bucket_s: float
) -> list[str]:
    """violations.png and gate_stalls.png in ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    if not buckets:
        return []
    origin = min(float(b["bucket"]) for b in buckets)
    if operations:
        origin = min(origin, min(float(op["start"]) for op in operations))
    times = [float(b["bucket"]) - origin for b in buckets]
    width = bucket_s * 0.9

    def mark_operations(axes: Any) -> None:
        for op in operations:
            axes.axvline(float(op["start"]) - origin, color="tab:red", linestyle="--", linewidth=1)
            axes.annotate(
                change_label(op),
                (float(op["start"]) - origin, 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                va="top",
                ha="right",
                fontsize=7,
                color="tab:red",
            )

    figure, axes = pyplot.subplots(figsize=(10, 4))
    bottom = [0.0] * len(buckets)
    for kind in KINDS:
        counts = [float(b.get(kind) or 0) for b in buckets]
        if any(counts):
            axes.bar(times, counts, width=width, bottom=bottom, align="edge", label=kind)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    if not any(bottom):
        axes.text(0.5, 0.5, "no anomalies", transform=axes.transAxes, ha="center")
    else:
        axes.legend(loc="best", fontsize=8)
    mark_operations(axes)
    axes.set_xlabel(f"seconds since {iso(origin)}")
    axes.set_ylabel(f"anomalies per {bucket_s:g} s")
    axes.set_title("Ordering anomalies (dashed: partition-count changes)")
    figure.tight_layout()
    figure.savefig(out / VIOLATIONS_CHART, dpi=100)
    pyplot.close(figure)

    figure, axes = pyplot.subplots(figsize=(10, 4))
    plotted = False
    for column, label in (
        ("gate_wait_max_s", "longest gate stall (bucket bound)"),
        ("gate_wait_p99_s", "gate stall p99"),
        ("hold_max_s", "longest produce hold (bucket bound)"),
    ):
        values = [b.get(column) for b in buckets]
        if any(v is not None for v in values):
            axes.step(
                times,
                [math.nan if v is None else float(v) for v in values],
                where="post",
                label=label,
            )
            plotted = True
    if plotted:
        axes.legend(loc="best", fontsize=8)
    else:
        axes.text(0.5, 0.5, "no Prometheus data", transform=axes.transAxes, ha="center")
    mark_operations(axes)
    axes.set_xlabel(f"seconds since {iso(origin)}")
    axes.set_ylabel("seconds")
    axes.set_title("Gate stalls and produce holds per bucket (Prometheus)")
    figure.tight_layout()
    figure.savefig(out / STALLS_CHART, dpi=100)
    pyplot.close(figure)
    return [VIOLATIONS_CHART, STALLS_CHART]


def prometheus_textfile(by_kind: Mapping[str, int]) -> str:
    """``sidecar_audit_anomalies_total`` per kind, in the text exposition format (for
    node_exporter's textfile collector or a Pushgateway; the alerts read it)."""
    lines = [
        "# HELP sidecar_audit_anomalies_total Anomalies the ordering audit found in its window.",
        "# TYPE sidecar_audit_anomalies_total counter",
    ]
    lines += [
        f'sidecar_audit_anomalies_total{{kind="{kind}"}} {by_kind.get(kind, 0)}' for kind in KINDS
    ]
    return "\n".join(lines) + "\n"
