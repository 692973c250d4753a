"""The longer schema-driven fuzzing run, against a real sidecar on a real cluster.

Run from the repository root (it stops by itself)::

    .venv/bin/python -m tests.fuzz.run [--minutes 10] [--seed N] [--workdir DIR]

The cluster is ``provide_cluster()``'s: an external one when
``SIDECAR_TEST_KAFKA_BOOTSTRAP`` and ``SIDECAR_TEST_ZOOKEEPER_HOSTS`` are set, otherwise
a fresh local one, stopped at the end. Six tenths of the time go to the stateless
phases (coverage, then fuzzing, over every operation of the served document), the rest
to the stateful phase along the document's links (create a consumer instance,
subscribe, poll, commit, delete). Without ``--seed`` each run draws its own inputs.

Prints what was sent and found; exits 1 on any server error or check failure. The
schemathesis reports (NDJSON of every request, JSON summary, console output) stay in
the work directory, so a failure can be replayed (``st replay <id>`` there).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from ordered_dev.devcluster.provider import provide_cluster
from tests.fuzz.harness import STATEFUL_OPERATIONS, FuzzResult, run_schemathesis
from tests.fuzz.target import fuzz_target


async def main(minutes: float, seed: int | None, workdir: Path) -> list[FuzzResult]:
    budget_s = max(20, int(minutes * 60))
    stateless_s = max(10, int(budget_s * 0.6))
    stateful_s = max(10, budget_s - stateless_s)
    with provide_cluster() as cluster:
        async with fuzz_target(cluster) as target:
            stateless = await run_schemathesis(
                target,
                workdir / "stateless",
                phases="examples,coverage,fuzzing",
                max_time_s=stateless_s,
                seed=seed,
            )
            print(f"stateless: {stateless.summary()}", flush=True)
            stateful = await run_schemathesis(
                target,
                workdir / "stateful",
                phases="stateful",
                max_time_s=stateful_s,
                operation_ids=STATEFUL_OPERATIONS,
                seed=seed,
            )
            print(f"stateful: {stateful.summary()}", flush=True)
    return [stateless, stateful]


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ordered-sidecar-fuzz-"))
    results = asyncio.run(main(args.minutes, args.seed, workdir))
    print(f"reports in {workdir}")
    bad = False
    for result in results:
        for line in result.server_errors[:20]:
            print(f"server error: {line}")
        bad = bad or bool(result.server_errors or result.failures or result.errors)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(cli())
