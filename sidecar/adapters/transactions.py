"""Writing managed topics through one Kafka transactional producer (DESIGN §5, fencing).

Why transactions: a sidecar that was paused past its ZooKeeper session (a long GC, a
frozen VM) notices nothing and, on resuming, sends what it had admitted across a
barrier it never saw. Only the storage can refuse such a zombie; Kafka's fencing token
for producers is the epoch of a transactional id (KIP-98). The coordinator of a change
fences every registered id no live sidecar owns (``fence``) before it reads the
boundaries, so whatever the zombie sends afterwards is rejected, and what it had sent
before is aborted or committed below the boundaries.

Requests are grouped into transactions: while one transaction commits, the records of
the requests that arrive meanwhile wait for the next one, so a busy sidecar commits
many requests at once and an idle one commits each request alone. A request is
answered once its transaction has ended:

* committed: a ``SentRecord`` per record;
* aborted, or never begun: ``SendFailed`` with ``maybe_appended`` False (a read-committed
  reader never sees the records; retrying is safe);
* unknown (the commit did not confirm in time, or was fenced after it was sent):
  ``SendFailed`` with ``maybe_appended`` True. ``WriteResult.settled`` completes once
  the transaction can no longer change outcome, which the barrier waits for.

Anything that leaves a transaction in doubt (an error, a timeout) is ended by
re-initialising the producer under the same id: Kafka completes or aborts the open
transaction before it answers. That re-initialisation also takes the id back from
whoever fenced it meanwhile: a sidecar resuming from a pause finds its commit timed out
(the clock ran on while it was stopped) and would, by re-initialising, undo the fence a
coordinator put on it. So the writer writes nothing more after settling a doubt: like a
fenced one, it fails closed (every queued and later write fails, not appended) and
``fenced`` is set until its owner replaces the writer with one under a new, registered
id, after reading the metadata again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError

from sidecar.adapters.kafka import (
    FENCED_ERRORS,
    OutgoingKafkaRecord,
    SendFailed,
    SentRecord,
    await_partition_count,
    enqueue,
    sent_record,
    start_transactional_producer,
)
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaUnavailable, ProducerFenced

_log = logging.getLogger(__name__)


Outcome = SentRecord | SendFailed


@dataclass(frozen=True, slots=True)
class WriteResult:
    outcomes: list[Outcome]
    """The answer for the request, one per record."""
    final: asyncio.Future[list[Outcome]]
    """Resolved once no record of the write can still become visible (or stop being so),
    with the outcomes as finally known: a commit confirmed late turns ``maybe_appended``
    failures into ``SentRecord``\\s. Records still ``maybe_appended`` then were settled
    by re-initialising the id, which waits until Kafka has written the markers."""


@dataclass(slots=True)
class _Request:
    topic: str
    records: Sequence[OutgoingKafkaRecord]
    answer: asyncio.Future[list[Outcome]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    final: asyncio.Future[list[Outcome]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def fail(self, message: str, *, maybe_appended: bool, settled: bool) -> None:
        """Answer every record with the same failure (retriable: nothing was refused)."""
        outcomes: list[Outcome] = [
            SendFailed(message, maybe_appended=maybe_appended, retriable=True)
        ] * len(self.records)
        if not self.answer.done():
            self.answer.set_result(outcomes)
        if settled:
            self.settle(outcomes)

    def settle(self, outcomes: list[Outcome]) -> None:
        if not self.answer.done():
            self.answer.set_result(outcomes)
        if not self.final.done():
            self.final.set_result(outcomes)


class TransactionalWriter:
    """One transactional producer and the queue of requests waiting for a transaction.

    ``start`` before use (it initialises the id, which fences any earlier producer of
    it), ``stop`` at the end. ``on_fenced`` is called once, on the event loop, when the
    id turns out to belong to another producer or the writer retired itself after
    settling a doubt.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        transactional_id: str,
        *,
        on_fenced: Callable[[], None] = lambda: None,
        stop_before_commit: int = 0,
    ) -> None:
        self.transactional_id = transactional_id
        self._stop_before_commit = stop_before_commit
        self._settings = settings
        self._timeout_s = settings.request_timeout_ms / 1000
        self._on_fenced = on_fenced
        self._producer: Any = None
        self._queue: list[_Request] = []
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._fenced = False
        self._stopping = False
        self.transactions = 0
        """Transactions committed so far."""

    @property
    def fenced(self) -> bool:
        return self._fenced

    async def start(self) -> None:
        """Initialise the transactional id. Raises KafkaUnavailable, ProducerFenced."""
        self._producer = await start_transactional_producer(self._settings, self.transactional_id)
        self._loop_task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Commit what is queued (for up to twice the request timeout), then close."""
        self._stopping = True
        self._wakeup.set()
        if self._loop_task is not None:
            done, _ = await asyncio.wait({self._loop_task}, timeout=2 * self._timeout_s)
            if not done:
                self._loop_task.cancel()
                await asyncio.gather(self._loop_task, return_exceptions=True)
        self._fail_queued("the sidecar is shutting down")
        await self._close_producer()

    async def write(self, topic: str, records: Sequence[OutgoingKafkaRecord]) -> WriteResult:
        """Write ``records`` to ``topic`` in the next transaction; one outcome per record.

        Waits at most about twice the request timeout: a request still queued then is
        withdrawn (not appended); one whose transaction is still ending is answered
        ``maybe_appended`` and settles later (``WriteResult.final``). Never raises for
        a record.
        """
        request = _Request(topic, records)
        if self._fenced or self._stopping or self._loop_task is None:
            reason = "was fenced" if self._fenced else "is not running"
            request.fail(f"the transactional producer {reason}", maybe_appended=False, settled=True)
            return WriteResult(request.answer.result(), request.final)
        self._queue.append(request)
        self._wakeup.set()
        await asyncio.wait({request.answer}, timeout=2 * self._timeout_s)
        if not request.answer.done():
            waited = f"{2 * self._timeout_s:g} s"
            if request in self._queue:
                self._queue.remove(request)
                request.fail(
                    f"no transaction began within {waited}", maybe_appended=False, settled=True
                )
            else:
                request.fail(
                    f"the transaction did not end within {waited}",
                    maybe_appended=True,
                    settled=False,
                )
        return WriteResult(request.answer.result(), request.final)

    # The transaction loop ---------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self._queue:
                group, self._queue = self._queue, []
                group = await self._with_known_partitions(group)
                if group:
                    await self._transact(group)
            if self._fenced:
                self._fail_queued("the transactional producer was fenced")
                return
            if self._stopping and not self._queue:
                return
            if self._queue:
                self._wakeup.set()

    async def _with_known_partitions(self, group: list[_Request]) -> list[_Request]:
        """The requests whose partitions the producer's metadata shows (a partition added
        moments ago shows at the next refresh); the others fail, not appended."""
        needed: dict[str, int] = {}
        for request in group:
            for record in request.records:
                needed[request.topic] = max(needed.get(request.topic, 0), record.partition + 1)
        missing: dict[str, str] = {}
        for topic, count in needed.items():
            try:
                await await_partition_count(
                    self._producer.client,
                    topic,
                    count,
                    self._timeout_s,
                    backoff_s=self._settings.retry_backoff_s,
                )
            except KafkaUnavailable as exc:
                missing[topic] = exc.message
        for request in group:
            if request.topic in missing:
                request.fail(missing[request.topic], maybe_appended=False, settled=True)
        return [request for request in group if request.topic not in missing]

    async def _transact(self, group: list[_Request]) -> None:
        deliveries: list[list[Any]] = []
        commit_requested = False
        try:
            await self._producer.begin_transaction()
            for request in group:
                deliveries.append(
                    [await enqueue(self._producer, request.topic, r) for r in request.records]
                )
            if self.transactions + 1 == self._stop_before_commit:
                await self._freeze(deliveries)
            commit_requested = True
            async with asyncio.timeout(self._timeout_s):
                await self._producer.commit_transaction()
        except Exception as exc:  # whatever it was, the transaction is in doubt
            # If a batch was refused, the commit cannot go out and nothing of the
            # transaction becomes visible; otherwise it may have (it is in doubt).
            commit_sent = commit_requested and not any(
                _holds_back_commit(d) for delivered in deliveries for d in delivered
            )
            for delivered in deliveries:
                for delivery in delivered:
                    if not isinstance(delivery, SendFailed):
                        # Nobody reads these outcomes: keep asyncio from logging them.
                        delivery.add_done_callback(_retrieve)
            await self._transaction_failed(group, exc, commit_sent=commit_sent)
            return
        self.transactions += 1
        for request, delivered in zip(group, deliveries, strict=True):
            request.settle([_outcome(d) for d in delivered])

    async def _freeze(self, deliveries: list[list[Any]]) -> None:
        """Fault injection: stop this process as a long GC pause or a frozen VM would,
        with this transaction's records appended and its commit not sent."""
        pending = {d for group in deliveries for d in group if not isinstance(d, SendFailed)}
        if pending:
            await asyncio.wait(pending, timeout=self._timeout_s)
        _log.warning("fault injection: stopping before the commit of %s", self.transactional_id)
        os.kill(os.getpid(), signal.SIGSTOP)

    async def _transaction_failed(
        self, group: list[_Request], exc: BaseException, *, commit_sent: bool
    ) -> None:
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, FENCED_ERRORS):
            # Whoever fenced us completed or aborted the transaction before their own
            # initialisation returned: settled, though a commit sent before may have won.
            _log.warning("transactional id %s fenced: %s", self.transactional_id, reason)
            for request in group:
                request.fail(
                    f"this sidecar's producer was fenced: {reason}",
                    maybe_appended=commit_sent,
                    settled=True,
                )
            self._mark_fenced()
            return
        # In doubt: answer now, and settle by re-initialising the id.
        _log.warning("transaction of %s failed: %s", self.transactional_id, reason)
        for request in group:
            request.fail(f"transaction failed: {reason}", maybe_appended=commit_sent, settled=False)
        await self._reset()
        for request in group:
            request.settle(request.answer.result())
        # The re-initialisation may have undone a fence this process could not see (see
        # the module's docstring): nothing more is written under this id.
        _log.warning("%s settled a doubt: retired, to be replaced", self.transactional_id)
        self._mark_fenced()

    async def _reset(self) -> None:
        """Replace the producer by one under the same id: Kafka completes or aborts the open
        transaction (and writes its markers) before it initialises the new one. Retried
        until it works, the id turns out fenced, or the writer stops."""
        await self._close_producer()
        while True:
            try:
                self._producer = await start_transactional_producer(
                    self._settings, self.transactional_id
                )
                return
            except ProducerFenced:
                self._mark_fenced()
                return
            except KafkaUnavailable as exc:
                _log.warning("re-initialising %s failed, retrying: %s", self.transactional_id, exc)
                if self._stopping:
                    return
                await asyncio.sleep(self._settings.reset_backoff_s)

    def _mark_fenced(self) -> None:
        if not self._fenced:
            self._fenced = True
            self._on_fenced()

    def _fail_queued(self, message: str) -> None:
        queued, self._queue = self._queue, []
        for request in queued:
            request.fail(message, maybe_appended=False, settled=True)

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            await asyncio.wait_for(producer.stop(), self._timeout_s)
        except (KafkaError, TimeoutError) as exc:
            _log.info("closing transactional producer %s: %s", self.transactional_id, exc)


def _retrieve(delivery: asyncio.Future[Any]) -> None:
    if not delivery.cancelled():
        delivery.exception()


def _holds_back_commit(delivery: Any) -> bool:
    """True if this send keeps its transaction from ever committing: its batch failed.

    A batch still pending does not: once commit_transaction was called, aiokafka sends
    the commit as soon as the pending batches are appended, also after the caller gave
    up waiting (seen: records of a commit that had timed out, answered "not written",
    became visible past a boundary the sidecar had let pass meanwhile)."""
    if isinstance(delivery, SendFailed):
        return False  # refused before it was queued: no batch to wait for
    return bool(delivery.done() and (delivery.cancelled() or delivery.exception()))


def _outcome(delivery: Any) -> Outcome:
    if isinstance(delivery, SendFailed):
        return delivery
    if not delivery.done():
        # The commit returned, so every batch was flushed: cannot happen.
        return SendFailed("no acknowledgement after the commit", maybe_appended=True)
    exc = delivery.exception()
    if exc is not None:
        return SendFailed(str(exc), maybe_appended=True)
    return sent_record(delivery.result())
