"""`sidecar demo --quick` as a user runs it, against the test cluster.

The demo's main flow with a few seconds of load per step and without the audit job
(tested on its own in tests/audit): three sidecar processes, producers and an ordered
consumer group over HTTP, an expansion with the CLI and a shrink with the admin API.
The demo checks per-key order itself; this test checks that it says so, that the
changes and hand-offs happened as linear hashing dictates, and that it stopped every
process it started.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from ordered_dev.demo.processes import STATE_FILE
from ordered_dev.devcluster.provider import ClusterEndpoints

_SIDECAR = str(Path(sys.executable).with_name("sidecar"))


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process other than a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_the_quick_demo_verifies_order_and_stops_what_it_started(
    cluster: ClusterEndpoints, tmp_path: Path
) -> None:
    process = await asyncio.create_subprocess_exec(
        _SIDECAR,
        "demo",
        "--quick",
        "--no-audit",
        "--kafka",
        cluster.kafka_bootstrap,
        "--zookeeper",
        cluster.zookeeper_hosts,
        "--replication-factor",
        str(cluster.replication_factor),
        "--work-dir",
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 300)
    text = output.decode()
    print(text)
    assert process.returncode == 0, text

    assert "per-key order    VERIFIED" in text
    produced = re.search(r"produced\s+([\d,]+) records acknowledged", text)
    assert produced is not None
    assert int(produced.group(1).replace(",", "")) > 0
    assert re.search(r"expand 4 -> 6 \(generation 0 -> 1\) via the CLI on sidecar-2: done", text)
    assert re.search(
        r"shrink 6 -> 5 \(generation 1 -> 2\) via the admin API of sidecar-3: done", text
    )
    # Linear hashing: 4 -> 6 moves keys of partitions 0 and 1 only, to 4 and 5; retiring
    # partition 5 moves its keys back to its parent, 1.
    expand, shrink = re.findall(r"keys moved .*, only (.*)", text)
    assert {pair.split(" ")[0] for pair in expand.split(", ")} == {"0->4", "1->5"}
    assert {pair.split(" ")[0] for pair in shrink.split(", ")} == {"5->1"}
    assert "keys_revoked(p0, generation 1)" in text
    assert "keys_revoked(p5, generation 2)" in text
    assert text.count("before the destination was assigned: yes") == 2

    pids = [int(pid) for pid in re.findall(r"^\s+sidecar-\d\s+\S+\s+pid (\d+)", text, re.M)]
    assert len(pids) == 3, text
    assert [pid for pid in pids if _running(pid)] == []
    assert not (tmp_path / STATE_FILE).exists()
