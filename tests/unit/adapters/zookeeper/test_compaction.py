"""Reading and writing a compacted generation log (``Topics.read_topic``,
``Topics.compact_log``) against ZooKeeper in memory: the folded part in the topic node,
the folded generations' nodes deleted in the same multi-op, and what a reader or a
compactor sees when another writer gets in between. The same against a real ZooKeeper:
``tests/integration/test_zookeeper_store.py``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sidecar.adapters.zookeeper.topics import encode_generation
from sidecar.core.compaction import compact
from sidecar.core.errors import OperationInProgress
from sidecar.core.generations import Boundary, GenerationLog
from sidecar.core.procedures import Operation, OperationKind, Phase, SidecarId
from sidecar.core.serialization import operation_to_json
from tests.unit.adapters.zookeeper.support import MemoryZooKeeper, memory_topics, stored_topic

TOPIC = "t"
PATH = "/ordered/topics/t"


def _log(changes: int) -> GenerationLog:
    """One partition grown to two and shrunk back, ``changes`` times in all; every
    boundary 10 past the one before."""
    log = GenerationLog.start(1)
    for index in range(changes):
        count = 2 if log.current.undeleted_count == 1 else 1
        offset = 10 * (index + 1)
        log = log.append(log.next_generation(count, [Boundary(offset), Boundary(offset)]))
    return log


def _generation_nodes(client: MemoryZooKeeper) -> list[int]:
    return sorted(int(name) for name in client.get_children(f"{PATH}/generations"))


def _journal(client: MemoryZooKeeper, phase: Phase) -> None:
    operation = Operation(
        topic=TOPIC,
        kind=OperationKind.EXPAND,
        from_generation=4,
        from_count=1,
        target_count=2,
        phase=phase,
        coordinator=SidecarId("s1"),
        started_at=0.0,
        barrier_deadline=1.0,
        physical_count=2,
    )
    client.create("/ordered/ops/t", json.dumps(operation_to_json(operation)).encode())


async def test_a_compaction_replaces_the_stored_log_in_one_multi_op() -> None:
    log = _log(4)
    client, topics = stored_topic(log)
    assert (await topics.read_topic(TOPIC)).log == log
    compacted = compact(log, 3)
    assert await topics.compact_log(TOPIC, log, compacted) == 3
    assert _generation_nodes(client) == [3, 4]
    assert (await topics.read_topic(TOPIC)).log == compacted
    # Folded again: nothing more to write, and the stored log unchanged.
    assert await topics.compact_log(TOPIC, compacted, compacted) == 0
    # Another sidecar's reader, which had every generation node cached, reads the new
    # log and forgets the nodes that are gone.
    assert await topics.compact_log(TOPIC, compacted, compact(log, 4)) == 1
    assert (await topics.read_topic(TOPIC)).log == compact(log, 4)
    assert list(topics._generations[TOPIC][1]) == ["0000000004"]


async def test_a_reader_that_cached_the_old_log_reads_the_compacted_one() -> None:
    log = _log(4)
    client, writer = stored_topic(log)
    reader = memory_topics(client)
    assert (await reader.read_topic(TOPIC)).log == log  # every node cached
    await writer.compact_log(TOPIC, log, compact(log, 2))
    assert (await reader.read_topic(TOPIC)).log == compact(log, 2)
    # A commit after the compaction adds a generation: read as before.
    longer = compact(log, 2)
    longer = longer.append(longer.next_generation(2, [Boundary(60), Boundary(60)]))
    client.create(f"{PATH}/generations/0000000005", encode_generation(longer.current))
    head = json.loads(client.get(PATH)[0])
    client.set(PATH, json.dumps(head | {"current_generation": 5}).encode())
    assert (await reader.read_topic(TOPIC)).log == longer


async def test_a_reader_whose_generation_nodes_are_folded_under_it_reads_again() -> None:
    log = _log(4)
    client, writer = stored_topic(log)

    class Racing(MemoryZooKeeper):
        """Folds the log at the reader's first read of a generation node."""

        raced = False

        def get(self, path: str, watch: object = None) -> tuple[bytes, SimpleNamespace]:
            if "/generations/0" in path and not self.raced:
                self.raced = True
                writer._compact_log(TOPIC, log, compact(log, 3))
            return super().get(path)

    racing = Racing()
    racing.nodes, racing._zxid = client.nodes, client._zxid
    writer._connection.client = racing
    reader = memory_topics(racing)
    assert (await reader.read_topic(TOPIC)).log == compact(log, 3)
    assert racing.raced


async def test_a_commit_between_reading_and_writing_leaves_the_log_it_made() -> None:
    log = _log(4)
    client, topics = stored_topic(log)
    before = dict(client.nodes)

    def commit_generation_5() -> None:
        head = json.loads(client.get(PATH)[0])
        client.set(PATH, json.dumps(head | {"current_generation": 5}).encode())

    client.before_commit.append(commit_generation_5)
    with pytest.raises(OperationInProgress, match="changed during its compaction"):
        await topics.compact_log(TOPIC, log, compact(log, 3))
    assert _generation_nodes(client) == [0, 1, 2, 3, 4]  # nothing deleted
    assert "folded" not in json.loads(client.get(PATH)[0])
    assert set(client.nodes) == set(before)


async def test_a_log_read_before_another_write_is_not_compacted() -> None:
    log = _log(4)
    client, topics = stored_topic(log)
    await topics.compact_log(TOPIC, log, compact(log, 2))
    # A second compactor still holding the log it read before the first one wrote.
    with pytest.raises(OperationInProgress, match="changed since it was read"):
        await topics.compact_log(TOPIC, log, compact(log, 3))
    assert _generation_nodes(client) == [2, 3, 4]


@pytest.mark.parametrize("phase", [Phase.BARRIER, Phase.COMMITTING, Phase.ROLLING_BACK])
async def test_no_compaction_while_a_change_is_in_progress(phase: Phase) -> None:
    log = _log(4)
    client, topics = stored_topic(log)
    _journal(client, phase)
    with pytest.raises(OperationInProgress, match="in progress"):
        await topics.compact_log(TOPIC, log, compact(log, 3))
    assert _generation_nodes(client) == [0, 1, 2, 3, 4]


async def test_a_change_started_between_reading_and_writing_stops_the_compaction() -> None:
    log = _log(4)
    client, topics = stored_topic(log)
    _journal(client, Phase.DONE)

    def start_a_change() -> None:
        raw = json.loads(client.get("/ordered/ops/t")[0])
        client.set("/ordered/ops/t", json.dumps(raw | {"phase": "barrier"}).encode())

    client.before_commit.append(start_a_change)
    with pytest.raises(OperationInProgress):
        await topics.compact_log(TOPIC, log, compact(log, 3))
    assert _generation_nodes(client) == [0, 1, 2, 3, 4]
    # Done again: the next pass folds.
    done = json.loads(client.get("/ordered/ops/t")[0]) | {"phase": "done"}
    client.set("/ordered/ops/t", json.dumps(done).encode())
    assert await topics.compact_log(TOPIC, log, compact(log, 3)) == 3


def test_a_compaction_must_keep_the_current_generation() -> None:
    log = _log(4)
    _, topics = stored_topic(log)
    with pytest.raises(ValueError, match="keeps the current generation"):
        topics._compact_log(TOPIC, log, compact(_log(3), 2))
