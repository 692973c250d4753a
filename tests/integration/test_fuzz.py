"""Schemathesis against a real sidecar on the real cluster, bounded for the test suite.

Two runs against the served OpenAPI document (``tests.fuzz.harness``): the stateless
phases over every operation, and the stateful phase along the document's links
(create a consumer instance, subscribe, poll, commit, delete). Both must find no
server error, no response that breaks its documented schema, status or content type,
and no invalid request answered as if it were valid. The seed is fixed so that a
failure reproduces; ``python -m tests.fuzz.run --minutes N`` runs longer with fresh
inputs. Together they take about two and a half minutes (each adds some ten seconds of
its own to its budget), and up to two more when the stateful walk needs another seed.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from ordered_dev.devcluster.provider import ClusterEndpoints
from tests.fuzz.harness import CHAIN, run_schemathesis
from tests.fuzz.target import fuzz_target

SEED = 253
STATELESS_S = 75
STATEFUL_S = 45
STATEFUL_RUNS = 3
WORKFLOW_LINKS = (
    "POST /consumers/{group} -> [200] Subscribe",
    "POST /consumers/{group}/instances/{name}/subscription -> [204] Poll",
    "GET /consumers/{group}/instances/{name}/records -> [200] Commit",
    "POST /consumers/{group}/instances/{name}/offsets -> [204] Delete",
)


def _fuzzable_operations() -> set[str]:
    """Every documented operation but the document itself (schemathesis leaves it out)."""
    document = json.loads((files("sidecar.http") / "openapi.json").read_text(encoding="utf-8"))
    return {
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        for method in item
        if method != "parameters"
    } - {"GET /openapi.json"}


async def test_stateless_fuzzing_of_every_operation_finds_nothing(
    cluster: ClusterEndpoints, tmp_path: Path
) -> None:
    async with fuzz_target(cluster) as target:
        result = await run_schemathesis(
            target, tmp_path, phases="examples,coverage,fuzzing", max_time_s=STATELESS_S, seed=SEED
        )
    print(f"stateless: {result.summary()}")
    assert result.operations == _fuzzable_operations(), result.output[-3000:]
    assert result.server_errors == []
    assert result.failures == {}, result.output[-6000:]
    assert result.errors == 0, result.output[-6000:]


async def test_stateful_fuzzing_along_the_links_finds_nothing(
    cluster: ClusterEndpoints, tmp_path: Path
) -> None:
    # The walk along the links is random: with one seed it may spend its time budget
    # without ever reaching the last step (any change to the document changes the walk).
    # So further seeds run, up to STATEFUL_RUNS, until every workflow link was followed;
    # every run must find nothing.
    followed: set[str] = set()
    for run in range(STATEFUL_RUNS):
        async with fuzz_target(cluster) as target:
            result = await run_schemathesis(
                target,
                tmp_path / f"run-{run}",
                phases="stateful",
                max_time_s=STATEFUL_S,
                operation_ids=CHAIN,
                seed=SEED + run,
            )
        print(f"stateful, seed {SEED + run}: {result.summary()}")
        assert result.server_errors == []
        assert result.failures == {}, result.output[-6000:]
        assert result.errors == 0, result.output[-6000:]
        followed |= set(result.links_followed)
        if followed >= set(WORKFLOW_LINKS):
            break
    # Every step of the workflow was reached by its link from a 2xx, answered 2xx.
    assert followed >= set(WORKFLOW_LINKS), sorted(followed)
