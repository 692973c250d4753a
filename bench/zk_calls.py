"""``sidecar serve`` with every ZooKeeper request of its kazoo client counted, for
``bench.scale``: which requests an idle sidecar makes, and from where.

Run as ``python -m bench.zk_calls serve`` with ``BENCH_ZK_CALLS_FILE`` naming a file:
every request the client queues (``KazooClient._call``: reads, writes, transactions,
watch registrations) is counted by operation, path pattern and the sidecar function
that made it, and so is every heartbeat ping; the totals so far are written to the file
as JSON once a second. Without the variable it is ``sidecar serve`` unchanged. The
sidecar's own code is not touched: the counting wraps kazoo's methods in this process.

Paths are reduced to patterns (the ZooKeeper root becomes ``<root>``, a topic, lock,
sidecar or producer name ``*``, a number ``#``), so that a table has one row per kind of
request whatever the topics are called.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ENV = "BENCH_ZK_CALLS_FILE"
"""The file the counts go to; counting is off without it."""
ROOT_ENV = "ORDERED_SIDECAR__ZOOKEEPER__ROOT"
PING = "ping"
WRITE_EVERY_S = 1.0
NAMED_COLLECTIONS = frozenset({"topics", "ops", "locks", "sidecars", "producers", "groups"})
"""Znodes whose children are named after a topic, sidecar, transactional id or group."""


def path_pattern(path: str, root: str) -> str:
    """``path`` with the root, names and numbers replaced (see the module docstring)."""
    root = root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        parts = ["<root>", *path[len(root) :].strip("/").split("/")]
    else:
        parts = path.strip("/").split("/")
    if parts and parts[-1] == "":
        parts.pop()
    reduced: list[str] = []
    for index, part in enumerate(parts):
        after_name = index > 0 and parts[index - 1] in NAMED_COLLECTIONS
        acked_by = index > 1 and parts[index - 2] == "barrier"  # barrier/<gen>/<sidecar>
        if (after_name or acked_by) and reduced[0] == "<root>":
            reduced.append("*")
        elif part.isdigit():
            reduced.append("#")
        else:
            reduced.append(part)
    return "/" + "/".join(reduced) if reduced[:1] != ["<root>"] else "/".join(reduced)


ORIGIN: contextvars.ContextVar[str] = contextvars.ContextVar("zk_call_origin", default="")
"""Who handed the blocking kazoo call to a worker thread (``asyncio.to_thread`` copies
the context into the thread): the coroutines above the ZooKeeper adapter."""
ADAPTER = "/sidecar/adapters/zookeeper/"


def _function(frame: traceback.FrameSummary, marker: str, prefix: str) -> str:
    module = frame.filename.rsplit(marker, 1)[1].removesuffix(".py").replace("/", ".")
    return f"{prefix}{module}.{frame.name}"


def origin(frames: Sequence[traceback.FrameSummary]) -> str:
    """The two innermost sidecar functions above the ZooKeeper adapter, outer first
    (``compose._housekeeping > service.changes.resume_abandoned``)."""
    found = [
        _function(frame, "/sidecar/", "")
        for frame in frames
        if "/sidecar/" in frame.filename and ADAPTER not in frame.filename
    ]
    return " > ".join(found[-2:])


def caller(frames: Sequence[traceback.FrameSummary], handed_by: str = "") -> str:
    """Who made a request: ``handed_by`` (its ``origin``) and the innermost sidecar
    function on the stack (the adapter's), else the kazoo recipe that made it (a watch
    reading its node again), else ``kazoo``."""
    for marker, prefix in (("/sidecar/", ""), ("/kazoo/recipe/", "kazoo.recipe.")):
        for frame in reversed(frames):
            if marker in frame.filename:
                inner = _function(frame, marker, prefix)
                return f"{handed_by} > {inner}" if handed_by else inner
    return handed_by or "kazoo"


class CallCounter:
    """Counts by (operation, path pattern, caller); thread-safe (kazoo calls come from
    the event loop's worker threads and kazoo's own)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def request(self, request: Any) -> None:
        operation = type(request).__name__
        path = getattr(request, "path", None)
        if path is None:  # a transaction: the path of its first operation
            operations = getattr(request, "operations", None) or []
            path = getattr(operations[0], "path", "") if operations else ""
            operation = f"{operation}({len(operations)})"
        frames = traceback.extract_stack()[:-2]
        key = (operation, path_pattern(str(path), self.root), caller(frames, ORIGIN.get()))
        with self._lock:
            self._counts[key] += 1

    def ping(self) -> None:
        with self._lock:
            self._counts[(PING, "", "kazoo heartbeat")] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            counts = [[*key, count] for key, count in sorted(self._counts.items())]
        return {"at": time.time(), "counts": counts}

    def write(self, path: Path) -> None:
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(json.dumps(self.snapshot()))
        os.replace(temporary, path)


def install(counter: CallCounter) -> None:
    """Wrap kazoo's request queueing and heartbeat, and ``asyncio.to_thread`` (to know
    which coroutine a blocking call came from), in this process."""
    from kazoo.client import KazooClient
    from kazoo.protocol.connection import ConnectionHandler

    original_call: Callable[..., Any] = KazooClient._call
    original_ping: Callable[..., Any] = ConnectionHandler._send_ping
    original_to_thread = asyncio.to_thread

    async def to_thread(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        # Set in the calling task's context, which the thread's copy inherits.
        ORIGIN.set(origin(traceback.extract_stack()[:-1]))
        return await original_to_thread(function, *args, **kwargs)

    def counted_call(self: Any, request: Any, async_object: Any) -> Any:
        counter.request(request)
        return original_call(self, request, async_object)

    def counted_ping(self: Any, connect_timeout: Any) -> Any:
        counter.ping()
        return original_ping(self, connect_timeout)

    KazooClient._call = counted_call
    ConnectionHandler._send_ping = counted_ping
    asyncio.to_thread = to_thread


def read_counts(path: Path) -> Counter[tuple[str, str, str]]:
    """The totals a counting sidecar last wrote (empty if it has not yet)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return Counter()
    return Counter({(op, pattern, who): int(n) for op, pattern, who, n in document["counts"]})


def _writer(counter: CallCounter, path: Path) -> None:
    while True:
        counter.write(path)
        time.sleep(WRITE_EVERY_S)


def main(argv: Sequence[str] | None = None) -> int:
    target = os.environ.get(ENV)
    if target:
        counter = CallCounter(os.environ.get(ROOT_ENV, "/ordered"))
        install(counter)
        threading.Thread(
            target=_writer, args=(counter, Path(target)), name="zk-calls", daemon=True
        ).start()
    from sidecar.cli import main as sidecar_main

    return sidecar_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
