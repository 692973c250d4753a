"""The markdown report of a chaos run (``bench/chaos.py`` writes it; the test prints the
failing checks with it)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from ordered_dev.harness.chaos.checks import CheckResult
from ordered_dev.harness.chaos.runner import ChaosOutcome

SHOWN_VIOLATIONS = 25


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(header), line(["---"] * len(header)), *(line(row) for row in rows)]


def verdicts(checks: Sequence[CheckResult]) -> list[str]:
    return table(
        ["check", "result", "violations"],
        [[c.title, "pass" if c.passed else "**FAIL**", f"{len(c.violations):,}"] for c in checks],
    )


def violations(check: CheckResult, shown: int = SHOWN_VIOLATIONS) -> list[str]:
    lines = [f"- {v}" for v in check.violations[:shown]]
    if len(check.violations) > shown:
        lines.append(f"- ... and {len(check.violations) - shown:,} more")
    return lines


def render(outcome: ChaosOutcome) -> list[str]:
    config, history = outcome.config, outcome.history
    verdict = "every check passed" if outcome.passed else "**checks failed**"
    lines = [
        f"## Setup (seed {config.seed})",
        "",
        f"- {config.sidecars} `sidecar serve` processes on one ZooKeeper root; "
        f"{outcome.settings_note}.",
        f"- two managed topics, {config.initial_count} partitions at first, changed to a random "
        "count in "
        f"[{config.initial_count}, {config.largest_count}] every {config.change_every_s[0]:g}-"
        f"{config.change_every_s[1]:g} s by a random sidecar ({config.cli_share:.0%} with "
        "`sidecar topics expand|shrink`, the rest over HTTP): "
        f"`{outcome.topics[0]}` (cleanup.policy delete) and `{outcome.topics[1]}` (compacted; "
        f"segment.ms {config.segment_ms}, segment.bytes {config.segment_bytes}, "
        f"min.cleanable.dirty.ratio {config.min_cleanable_dirty_ratio:g}).",
        f"- {config.producers} producers, each through one sidecar to one topic, one request at "
        f"a time of {config.keys_per_producer} keyed records (one per key), "
        f"{config.produce_pause_s:g} s apart; a produce naming an older generation every "
        f"{config.stale_probe_every_s:g} s.",
        *(f"- group `{g.name}`: {g.mode}, one instance on each sidecar." for g in outcome.groups),
        f"- faults one at a time, {config.fault_gap_s[0]:g}-{config.fault_gap_s[1]:g} s apart, "
        f"in shuffled rounds of every kind: sidecar SIGKILL (down {_range(config.sidecar_down_s)})"
        f", sidecar SIGSTOP (zombie: session timeout + {_range(config.zombie_beyond_session_s)}),"
        f" consumer instance deleted and created again, ZooKeeper SIGSTOP "
        f"({_range(config.zookeeper_pause_s)}), broker SIGKILL (down "
        f"{_range(config.broker_down_s)}), callback endpoints answering 503 "
        f"({_range(config.callback_refusal_s)}).",
        *(
            [
                f"- retention: every {config.trim_every_s:g} s (±20 %) the harness deletes "
                f"`{outcome.topics[0]}`'s records below what both groups committed, after "
                "reading them for the checks."
            ]
            if config.trim_every_s > 0
            else []
        ),
        f"- load phase {outcome.load_s:.0f} s; whole run {outcome.elapsed_s:.0f} s.",
        *(
            f"- group `{group}`: {done:,} rebalances of its instances (partitions assigned, "
            f"summed over instances), {asked:,} asked by the sidecars for changes."
            for group, (done, asked) in outcome.rebalances.items()
        ),
        "",
        f"## Outcome: {verdict}",
        "",
        *verdicts(outcome.checks),
        "",
    ]
    for check in outcome.checks:
        lines += [f"### {check.title}", "", *table(["what", "value"], check.facts), ""]
        if check.violations:
            lines += [f"Violations ({len(check.violations):,}):", "", *violations(check), ""]
        if check.notes:
            lines += ["Notes:", "", *(f"- {n}" for n in check.notes[:SHOWN_VIOLATIONS]), ""]
            if len(check.notes) > SHOWN_VIOLATIONS:
                lines += [f"- ... and {len(check.notes) - SHOWN_VIOLATIONS:,} more", ""]
    lines += _faults(outcome)
    lines += _changes(outcome)
    lines += [
        "## Produce and consume",
        "",
        *table(
            ["what", "value"],
            [
                ["produce requests", f"{history.produce_requests:,}"],
                ["records acknowledged", f"{len(history.acked):,}"],
                ["requests or records refused", _counts(history.produce_refused)],
                *(
                    [
                        f"{group}: deliveries (distinct records)",
                        f"{sum(1 for d in history.deliveries if d.group == group):,} "
                        f"({len(history.seen[group]):,})",
                    ]
                    for group in history.groups
                ),
                ["hand-off events received", _handoff_counts(outcome)],
                ["callbacks refused (503) during faults", _counts(history.refused_callbacks)],
                ["consumer instance incarnations", f"{len(history.incarnations):,}"],
                ["poll errors", _counts(history.poll_errors)],
                ["commits or acks refused", _counts(history.commit_refusals)],
            ],
        ),
        "",
    ]
    if history.notes:
        lines += ["Notes:", "", *(f"- {n}" for n in history.notes[:SHOWN_VIOLATIONS]), ""]
    lines += ["Sidecar logs:", "", *(f"- `{p}`" for p in outcome.sidecar_logs), ""]
    return lines


def _faults(outcome: ChaosOutcome) -> list[str]:
    history = outcome.history
    per_kind: dict[str, list[float]] = defaultdict(list)
    for fault in history.faults:
        per_kind[fault.kind].append(fault.ended - fault.started)
    lines = [
        "## Faults",
        "",
        *table(
            ["kind", "count", "mean duration", "longest"],
            [
                [kind, str(len(d)), f"{sum(d) / len(d):.1f} s", f"{max(d):.1f} s"]
                for kind, d in sorted(per_kind.items())
            ],
        ),
        "",
        f"Last fault ended at {outcome.times.last_fault_end:.1f} s; the producers stopped at "
        f"{outcome.times.producers_stopped:.1f} s.",
        "",
        "<details><summary>Every fault</summary>",
        "",
        *table(
            ["at", "kind", "target", "took", "detail"],
            [
                [
                    f"{f.started:.1f} s",
                    f.kind,
                    f.target,
                    f"{f.ended - f.started:.1f} s",
                    f.detail,
                ]
                for f in history.faults
            ],
        ),
        "",
        "</details>",
        "",
    ]
    return lines


def _changes(outcome: ChaosOutcome) -> list[str]:
    history = outcome.history
    during = [c for c in history.changes if not c.final]
    outcomes = Counter(c.outcome for c in during)
    via = Counter(c.via for c in during if c.outcome not in ("skipped", "no sidecar running"))
    done = [c.seconds for c in during if c.outcome == "done"]
    lines = [
        "## Partition-count changes",
        "",
        *table(
            ["what", "value"],
            [
                [
                    "changes tried (HTTP / CLI)",
                    f"{sum(via.values())} ({via['http']} / {via['cli']})",
                ],
                ["done", str(outcomes["done"])],
                ["rolled back (409 40930)", str(outcomes["rolled_back"])],
                ["refused: another change in progress (409 40920)", str(outcomes["409 40920"])],
                [
                    "other outcomes",
                    _counts(
                        Counter(
                            {
                                k: v
                                for k, v in outcomes.items()
                                if k not in ("done", "rolled_back", "409 40920")
                            }
                        )
                    ),
                ],
                [
                    "duration of the done ones (median / max)",
                    f"{sorted(done)[len(done) // 2]:.1f} s / {max(done):.1f} s" if done else "-",
                ],
            ],
        ),
        "",
        "<details><summary>Every change</summary>",
        "",
        *table(
            ["at", "topic", "count", "coordinator", "via", "outcome", "took"],
            [
                [
                    f"{c.at:.1f} s",
                    c.topic,
                    f"{c.from_count} -> {c.target}",
                    c.coordinator,
                    c.via + (" (after the faults)" if c.final else ""),
                    c.outcome,
                    f"{c.seconds:.1f} s",
                ]
                for c in history.changes
            ],
        ),
        "",
        "</details>",
        "",
    ]
    return lines


def _range(bounds: tuple[float, float]) -> str:
    return f"{bounds[0]:g}-{bounds[1]:g} s"


def _counts(counter: Counter[str]) -> str:
    if not counter:
        return "0"
    return ", ".join(f"{n:,} x {what}" for what, n in counter.most_common())


def _handoff_counts(outcome: ChaosOutcome) -> str:
    counter = Counter(f"{h.group[-9:]} {h.kind} ({h.via})" for h in outcome.history.handoffs)
    return _counts(counter)


def dump(outcome: ChaosOutcome, path: Path) -> None:
    """Everything the run observed, as JSON, for a post-mortem of its violations."""
    history = outcome.history
    document = {
        "config": dataclasses.asdict(outcome.config),
        "topics": outcome.topics,
        "groups": [g.name for g in outcome.groups],
        "generations": {
            s.name: [
                {
                    "number": g.number,
                    "count": g.undeleted_count,
                    "boundaries": [b.offset for b in g.boundaries],
                }
                for g in s.log.generations
            ]
            for s in outcome.snapshots
        },
        "modes": {s.name: [m.value for m in s.modes] for s in outcome.snapshots},
        "log_start": {s.name: s.log_start for s in outcome.snapshots},
        "log_end": {s.name: s.log_end for s in outcome.snapshots},
        "compacted_records": {
            s.name: [
                [
                    r.partition,
                    r.offset,
                    (r.key or b"").decode(errors="replace"),
                    None if r.value is None else r.value.decode(errors="replace")[:80],
                    {k: (v or b"").decode(errors="replace") for k, v in r.headers.items()},
                ]
                for r in s.records
            ]
            for s in outcome.snapshots
            if s.compacted
        },
        "faults": [dataclasses.asdict(f) for f in history.faults],
        "changes": [dataclasses.asdict(c) for c in history.changes],
        "incarnations": {
            i.id: dataclasses.asdict(i) | {"ended": history.ended.get(i.id)}
            for i in history.incarnations.values()
        },
        "handoffs": [dataclasses.asdict(h) for h in history.handoffs],
        "commits": [
            [group, topic, partition, samples]
            for (group, topic, partition), samples in history.commits.items()
        ],
        "acked": [dataclasses.asdict(a) for a in history.acked.values()],
        "deliveries": [
            [
                d.order,
                round(d.at, 3),
                d.group,
                d.incarnation,
                d.topic,
                d.partition,
                d.offset,
                d.record,
            ]
            for d in history.deliveries
        ],
        "compacted_away": sorted(history.compacted_away),
        "violations": {c.key: c.violations for c in outcome.checks},
    }
    path.write_text(json.dumps(document))


def failure_summary(checks: Sequence[CheckResult], shown: int = 10) -> str:
    """The failing checks with their first violations, for an assertion message."""
    parts = []
    for check in checks:
        if check.passed:
            continue
        parts.append(f"{check.key} ({len(check.violations)} violations): {check.title}")
        parts += [f"    {v[:600]}" for v in check.violations[:shown]]
    return "\n".join(parts)
