"""What a long generation log costs the consume path: the gate's waits and the hand-off's
revocation points against the number of changes a topic went through.

Run from the repository root::

    .venv/bin/python -m bench.log_length [--quick]

Pure core code, no cluster. Every change of a topic gives every sidecar a new
``GenerationLog``, and what the consume path derives from it (``waits_into`` for the
generations its partitions are reading, ``revocation_points`` of every partition) is
computed again for that log on the sidecar's event loop. For logs of 10 to 10,000 changes
(counts drawn in [2, 12], as in the chaos runs), measured on a fresh log each time:

* **waits**: ``waits_into`` of every partition at its 20 newest generations;
* **closure by definition** (the baseline, in the same run): the same waits computed as
  the module comment defines them, the closure of ``direct_waits`` taken node by node,
  each node's direct waits a pass over every older change. The sidecar computed them
  that way until the waits were evaluated once per change into a partition;
* **revocation points**: ``revocation_points`` of every partition.

Printed: milliseconds per log (best of the repeats) and the baseline's ratio to the
waits. The baseline is left out above 400 changes (it takes tens of seconds there).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.report import command_line, machine_lines, markdown_table, write_result
from sidecar.core.gate import Wait, waits_into
from sidecar.core.generations import Boundary, ChangeKind, GenerationLog
from sidecar.core.handoff import revocation_points
from sidecar.core.routing import expansion_blocker, shrink_blockers

LENGTHS = (10, 50, 100, 200, 400, 1_000, 10_000)
BASELINE_UP_TO = 400
NEWEST = 20
"""Generations per partition asked, the newest ones: a consumer behind by a few changes
reads records of several."""


@dataclass(frozen=True, slots=True)
class Row:
    changes: int
    waits_ms: float
    baseline_ms: float | None
    revocations_ms: float


def make_log(changes: int, seed: int = 2042) -> GenerationLog:
    """A topic of 2 initial partitions changed ``changes`` times to a random count in
    [2, 12], a few records written to each partition between two changes."""
    rng = random.Random(seed)
    log = GenerationLog.start(2)
    ends = [0] * 12
    for _ in range(changes):
        current = log.current.undeleted_count
        target = rng.choice([c for c in range(2, 13) if c != current])
        physical = max(target, log.current.physical_count)
        for partition in range(physical):
            ends[partition] += rng.randint(0, 50)
        boundaries = [Boundary(ends[p]) for p in range(physical)]
        log = log.append(log.next_generation(target, boundaries))
    return log


def fresh(log: GenerationLog) -> GenerationLog:
    """The same generations in a new log object, as a sidecar reads after a change."""
    return GenerationLog(log.initial_count, log.generations)


def asked(log: GenerationLog) -> list[tuple[int, int]]:
    newest = log.current.number
    return [
        (partition, generation)
        for partition in range(log.current.physical_count)
        for generation in range(max(0, newest - NEWEST + 1), newest + 1)
    ]


def waits_by_definition(log: GenerationLog, partition: int, generation: int) -> tuple[Wait, ...]:
    """The baseline: the closure of the direct waits node by node, each node's direct
    waits found by a pass over changes ``1..generation``."""
    strongest: dict[int, Wait] = {}
    seen: set[tuple[int, int]] = set()
    pending = [(partition, generation)]
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        for wait in _direct_waits_by_definition(log, *node):
            held = strongest.get(wait.source)
            if held is None or (wait.boundary, wait.generation) > (held.boundary, held.generation):
                strongest[wait.source] = wait
            pending.append((wait.source, wait.generation - 1))
    return tuple(strongest[s] for s in sorted(strongest) if strongest[s].boundary > 0)


def _direct_waits_by_definition(log: GenerationLog, partition: int, generation: int) -> list[Wait]:
    waits = []
    for number in range(1, generation + 1):
        old_count = log[number - 1].undeleted_count
        new_count = log[number].undeleted_count
        if new_count > old_count:
            if not old_count <= partition < new_count:
                continue
            sources = [expansion_blocker(partition, log.initial_count, old_count)]
            kind = ChangeKind.EXPANSION
        elif partition < new_count:
            sources = shrink_blockers(partition, log.initial_count, old_count, new_count)
            kind = ChangeKind.SHRINK
        else:
            continue
        for source in sources:
            boundary = log[number].boundary(source)
            assert boundary is not None
            waits.append(Wait(source, boundary, number, kind))
    return waits


def best_ms(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return min(times) * 1000


def measure(changes: int, repeats: int) -> Row:
    log = make_log(changes)
    nodes = asked(log)

    def waits() -> None:
        log_now = fresh(log)
        for node in nodes:
            waits_into(log_now, *node)

    def baseline() -> None:
        for node in nodes:
            waits_by_definition(log, *node)

    def revocations() -> None:
        log_now = fresh(log)
        for partition in range(log.current.physical_count):
            revocation_points(log_now, partition)

    # The two must agree, or the comparison means nothing.
    if changes <= BASELINE_UP_TO:
        check = fresh(log)
        for node in nodes:
            assert waits_into(check, *node) == waits_by_definition(log, *node), node
    return Row(
        changes,
        best_ms(waits, repeats),
        best_ms(baseline, 1) if changes <= BASELINE_UP_TO else None,
        best_ms(revocations, repeats),
    )


def render(rows: Sequence[Row], repeats: int) -> list[str]:
    table = [
        [
            f"{row.changes}",
            f"{row.waits_ms:.1f}",
            "-" if row.baseline_ms is None else f"{row.baseline_ms:,.0f}",
            "-" if row.baseline_ms is None else f"{row.baseline_ms / row.waits_ms:,.0f}",
            f"{row.revocations_ms:.1f}",
        ]
        for row in rows
    ]
    return [
        f"Per fresh log, every partition at its {NEWEST} newest generations; best of "
        f"{repeats} (the baseline: one run).",
        "",
        *markdown_table(
            [
                "changes in the log",
                "waits (ms)",
                "closure by definition (ms)",
                "baseline / waits",
                "revocation points (ms)",
            ],
            table,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one repeat, logs up to 200")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else 5
    lengths = [n for n in LENGTHS if not args.quick or n <= 200]
    rows = [measure(n, repeats) for n in lengths]
    body = render(rows, repeats)
    header = [
        *machine_lines("not used (pure core code)"),
        f"- command: `{command_line('bench.log_length')}`",
    ]
    print("\n".join(body))
    path = write_result("log_length", "Generation log length benchmark", header, body)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
