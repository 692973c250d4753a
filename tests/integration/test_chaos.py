"""A short seeded chaos run: one fault of each kind under load and changes, then every
check of ``ordered_dev.harness.chaos.checks``.

Three ``sidecar serve`` processes, a delete and a compacted managed topic, six
producers, a callback-mode and an events-mode group of three instances each; a change
every 3-8 s; one fault of each kind, one at a time (sidecar SIGKILL, sidecar SIGSTOP past
its session timeout, a consumer instance deleted and created again, ZooKeeper SIGSTOP,
broker SIGKILL, callback endpoints answering 503), and the delete topic's records
below both groups' commits deleted every 5 s, so that the sidecars fold its generation
log as they go. The checks: per-key order in each group, liveness after the last fault,
the key hand-off contract, stale produces fenced, nothing written across a barrier, the
folded log against every generation seen, compaction, and changes never blocked.

It stops servers of the cluster this run started (and restores them), so it skips only
against an external cluster. ``bench/chaos.py`` runs the same for N minutes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.chaos.plan import ChaosConfig
from ordered_dev.harness.chaos.report import dump, failure_summary, render
from ordered_dev.harness.chaos.runner import ChaosRun

# Short versions of the bench's ranges, so that the whole run stays within 3 minutes;
# the session timeout, the pause lengths relative to it and the liveness bound are the
# bench's.
SHORT_RUN = ChaosConfig(
    seed=11,
    fault_rounds=1,
    fault_gap_s=(1.0, 2.0),
    sidecar_down_s=(0.5, 1.0),
    zombie_beyond_session_s=(3.0, 4.0),
    zookeeper_pause_s=(12.0, 13.0),
    broker_down_s=(2.0, 3.0),
    callback_refusal_s=(3.0, 4.0),
    drain_limit_s=35.0,
    compaction_wait_s=30.0,
    # Retention of the delete topic below both groups' commits, and the sidecars'
    # generation-log compaction often enough to fold under the faults.
    trim_every_s=5.0,
    compaction_interval_s=3.0,
)


async def test_one_fault_of_each_kind_under_changes(cluster: ClusterEndpoints) -> None:
    if cluster.local is None:
        pytest.skip("stops cluster servers: needs the local cluster this run starts (as in CI)")
    outcome = await ChaosRun(SHORT_RUN, cluster, remove_data=True).run()
    print("\n".join(render(outcome)))
    history = Path(tempfile.gettempdir()) / f"chaos-history-{SHORT_RUN.seed}.json"
    dump(outcome, history)
    kinds = {fault.kind for fault in outcome.history.faults}
    assert kinds == {kind.value for kind in SHORT_RUN.fault_kinds}, kinds
    assert sum(c.outcome == "done" for c in outcome.history.changes) >= 3
    delete_topic = outcome.snapshots[0]
    assert delete_topic.stored_log is not None
    assert delete_topic.stored_log.first_number > 0, "compaction folded nothing"
    failing = [check.key for check in outcome.checks if not check.passed]
    assert failing == [], f"{failure_summary(outcome.checks)}\n(everything observed: {history})"
