"""The growth curves of ``docs/scale.md``, drawn from the committed scale results.

Run from the repository root after ``bench.scale`` and ``bench.compaction`` wrote their
reports::

    .venv/bin/python -m bench.scale_chart [--out docs/scale.png]

It reads the tables of ``bench/results/scale-sidecars.md`` (a change's time and the
idle load against sidecars, the start time against managed topics) and
``bench/results/compaction.md`` (reading a topic at start against the changes in its
history, compaction off and on), and draws one figure of four panels, each with its
goal. It measures nothing itself: the figures are those of the reports, which say on
what machine and under what load they were taken.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bench.report import RESULTS_DIR

REPOSITORY = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPOSITORY / "docs" / "scale.png"


def markdown_tables(text: str) -> list[list[dict[str, str]]]:
    """Every table of a markdown text, as rows keyed by the header's cells (a repeated
    header cell keeps its first column; markup such as ``**`` is stripped)."""
    tables: list[list[dict[str, str]]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("|") and index + 1 < len(lines) and lines[index + 1].startswith("| ---"):
            header = _cells(line)
            rows = []
            index += 2
            while index < len(lines) and lines[index].startswith("|"):
                cells = _cells(lines[index])
                row: dict[str, str] = {}
                for name, cell in zip(header, cells, strict=False):
                    row.setdefault(name, cell)
                rows.append(row)
                index += 1
            tables.append(rows)
        else:
            index += 1
    return tables


def _cells(line: str) -> list[str]:
    return [cell.strip().replace("**", "") for cell in line.strip().strip("|").split("|")]


def table_with(tables: Sequence[list[dict[str, str]]], *columns: str) -> list[dict[str, str]]:
    """The first table whose header has every one of ``columns``."""
    for rows in tables:
        if rows and all(column in rows[0] for column in columns):
            return rows
    raise ValueError(f"no table with the columns {columns}")


def number(cell: str) -> float:
    return float(cell.replace(",", "").split()[0])


def draw(sidecars_report: Path, compaction_report: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = markdown_tables(sidecars_report.read_text())
    changes = table_with(scale, "sidecars", "barrier to commit, median s")
    idle = table_with(scale, "sidecars", "requests/s per idle sidecar (baseline subtracted)")
    starts = [
        row
        for row in table_with(scale, "managed topics", "start to /readyz 200, median s")
        if row["lanes"] == "1"
    ]
    compaction = table_with(
        markdown_tables(compaction_report.read_text()), "changes", "read at start (ms)"
    )

    figure, axes = plt.subplots(2, 2, figsize=(11, 8))
    change_axes, idle_axes, start_axes, log_axes = axes.flat

    fleet = [number(r["sidecars"]) for r in changes]
    change_axes.plot(
        fleet,
        [number(r["barrier to commit, median s"]) for r in changes],
        "o-",
        label="barrier to commit, median",
    )
    change_axes.plot(
        fleet,
        [number(r["request to done, median s"]) for r in changes],
        "s--",
        label="admin request to done, median",
    )
    change_axes.axhline(2.0, color="red", linestyle=":", label="goal: 2 s at 100 sidecars")
    change_axes.set(
        xscale="log", xlabel="sidecars", ylabel="seconds", title="A partition-count change"
    )

    measured = [r for r in idle if number(r["sidecars"]) > 0]
    idle_axes.plot(
        [number(r["sidecars"]) for r in measured],
        [number(r["requests/s per idle sidecar (baseline subtracted)"]) for r in measured],
        "o-",
        label="per idle sidecar",
    )
    idle_axes.axhline(1.0, color="red", linestyle=":", label="goal: 1 per s")
    idle_axes.set(
        xscale="log",
        xlabel="sidecars",
        ylabel="ZooKeeper requests per s",
        title="Idle ZooKeeper load",
        ylim=(0, 1.2),
    )

    start_axes.plot(
        [number(r["managed topics"]) for r in starts],
        [number(r["start to /readyz 200, median s"]) for r in starts],
        "o-",
        label="start to ready",
    )
    start_axes.axhline(5.0, color="red", linestyle=":", label="goal: 5 s at 1,000 topics")
    start_axes.set(
        xscale="log", xlabel="managed topics", ylabel="seconds", title="A sidecar's start"
    )

    for mode, style in (("off", "s--"), ("on", "o-")):
        rows = [r for r in compaction if r["compaction"] == mode]
        log_axes.plot(
            [number(r["changes"]) for r in rows],
            [number(r["read at start (ms)"]) for r in rows],
            style,
            label=f"compaction {mode}",
        )
    log_axes.set(
        xscale="log",
        yscale="log",
        xlabel="changes in the topic's history",
        ylabel="ms",
        title="Reading a topic at start",
    )

    for panel in axes.flat:
        panel.grid(True, which="both", alpha=0.3)
        panel.legend(fontsize="small")
    figure.suptitle(f"ordered-sidecar at scale ({sidecars_report.name}, {compaction_report.name})")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sidecars-report", type=Path, default=RESULTS_DIR / "scale-sidecars.md")
    parser.add_argument("--compaction-report", type=Path, default=RESULTS_DIR / "compaction.md")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the PNG written")
    args = parser.parse_args(argv)
    draw(args.sidecars_report, args.compaction_report, args.out)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
