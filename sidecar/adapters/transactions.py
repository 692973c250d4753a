"""Writing managed topics through Kafka transactional producers (DESIGN §5, fencing).

Why transactions: a sidecar that was paused past its ZooKeeper session (a long GC, a
frozen VM) notices nothing and, on resuming, sends what it had admitted across a
barrier it never saw. Only the storage can refuse such a zombie; Kafka's fencing token
for producers is the epoch of a transactional id (KIP-98). The coordinator of a change
fences every registered id no live sidecar owns (``fence``) before it reads the
boundaries, so whatever the zombie sends afterwards is rejected, and what it had sent
before is aborted or committed below the boundaries.

Requests are grouped into transactions: while one transaction is appended, the records
of the requests that arrive meanwhile wait for the next one, so a busy sidecar commits
many requests at once and an idle one commits each request alone. Transactions take
turns over a few transactional ids (``kafka.transaction_lanes``), so that the next one
is appended while the previous one commits; they still commit one after the other, in
order (``TransactionalWriter``). A request is answered once its transaction has ended:

* committed: a ``SentRecord`` per record;
* aborted, or never begun: ``SendFailed`` with ``maybe_appended`` False (a read-committed
  reader never sees the records; retrying is safe);
* unknown (the commit did not confirm in time, or was fenced after it was sent):
  ``SendFailed`` with ``maybe_appended`` True. ``WriteResult.settled`` completes once
  the transaction can no longer change outcome, which the barrier waits for.

A transaction that failed before its commit was asked for, without an answer from Kafka
(its connections could not be made again), asks whether Kafka refuses this sidecar's
credentials now (``refused_identity``: revoked, or a password changed, while it runs).
If so its requests, those queued and every later one fail with ``identity_refused``
(nothing appended) until the credentials work again, instead of waiting for a
transaction that cannot begin.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aiokafka.errors import BrokerResponseError, KafkaError

from sidecar.adapters.kafka import (
    FENCED_ERRORS,
    OutgoingKafkaRecord,
    QueuedRecord,
    SendFailed,
    SentRecord,
    add_partitions_ahead,
    await_partition_count,
    enqueue_all,
    in_transaction,
    ready_to_begin,
    refused_identity,
    start_transactional_producer,
)
from sidecar.config import ConfigError, KafkaSettings
from sidecar.core.errors import (
    KafkaAuthenticationFailed,
    KafkaUnavailable,
    ProducerFenced,
)
from sidecar.faults import FaultHooks

_log = logging.getLogger(__name__)


Outcome = SentRecord | SendFailed

# How a transaction ended (``TransactionalWriter``'s ``on_ended``): the bounded values of
# ``sidecar_transactions_total``'s ``outcome`` label.
TX_COMMITTED: Final = "committed"
TX_FAILED: Final = "failed"
"""It failed or its commit went unanswered: settled by re-initialising the id."""
TX_FENCED: Final = "fenced"
TX_ABORTED: Final = "aborted"
"""Aborted, its records never visible, because an earlier transaction failed."""


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
        self._answer_all(
            SendFailed(message, maybe_appended=maybe_appended, retriable=True), settled=settled
        )

    def refuse(self, refusal: KafkaAuthenticationFailed) -> None:
        """Answer every record: Kafka refuses this sidecar's credentials, nothing of the
        request was appended (settled: no commit was asked for)."""
        failure = SendFailed(
            refusal.message, maybe_appended=False, retriable=False, identity_refused=True
        )
        self._answer_all(failure, settled=True)

    def _answer_all(self, failure: SendFailed, *, settled: bool) -> None:
        outcomes: list[Outcome] = [failure] * len(self.records)
        if not self.answer.done():
            self.answer.set_result(outcomes)
        if settled:
            self.settle(outcomes)

    def settle(self, outcomes: list[Outcome]) -> None:
        if not self.answer.done():
            self.answer.set_result(outcomes)
        if not self.final.done():
            self.final.set_result(outcomes)


@dataclass(slots=True)
class _Lane:
    """One transactional id and its producer: one transaction open at a time."""

    transactional_id: str
    producer: Any = None
    ending: asyncio.Task[bool] | None = None
    """The end (commit or abort) of its last transaction, while that runs."""
    begun_ahead: bool = False
    """Its next transaction was begun while the lane before it appended, to add the
    partitions of the requests queued meanwhile ahead of their records."""


class TransactionalWriter:
    """Transactional producers (one per id, *lanes*) and the queue of requests waiting
    for a transaction.

    A lone producer cannot begin its next transaction until Kafka has written the
    markers of the previous one (AddPartitionsToTxn is refused meanwhile), which was
    most of a transaction's time. With several lanes used in turn, the next transaction
    is appended on one lane while the previous one commits on another. Two rules keep
    that equal to one transaction after the other:

    * a transaction's records are sent only once the previous transaction's records are
      appended, so within a partition the offsets follow the order of admission;
    * a transaction commits only after the previous one committed. If one fails, every
      later one is aborted: nothing is acknowledged after a record that was not.

    While a transaction's records are appended, the next lane's transaction is begun and
    the partitions of the requests queued meanwhile are added to it (AddPartitionsToTxn)
    before their records are sent: that round trip, and the polls while the coordinator
    still writes the lane's previous markers, no longer come before the records' produce
    request. Every partition added belongs to a request that is queued, admitted in the
    current generation and counted in flight until answered, so the markers written
    there land before any boundary a change reads. A partition can still end up added
    without a record, and hold one marker more: a request withdrawn after twice the
    request timeout, one failed because a lane's metadata does not show its partition,
    and a writer that stops or retires with a transaction begun ahead (aborted at
    ``stop``); docs/fencing.md says why that is safe.

    ``start`` before use (it initialises every id, which fences any earlier producer of
    them), ``stop`` at the end. ``on_fenced`` is called once, on the event loop, when an
    id turns out to belong to another producer or the writer retired itself after
    settling a doubt. ``on_ended`` is told how each transaction ended (``TX_*``).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        transactional_ids: Sequence[str],
        *,
        on_fenced: Callable[[], None] = lambda: None,
        on_ended: Callable[[str], None] = lambda outcome: None,
        faults: FaultHooks | None = None,
    ) -> None:
        if not transactional_ids:
            raise ValueError("a writer needs at least one transactional id")
        self.transactional_ids = tuple(transactional_ids)
        self._lanes = [_Lane(transactional_id) for transactional_id in self.transactional_ids]
        self._next_lane = 0
        self._last_ending: asyncio.Task[bool] | None = None
        """The end of the newest transaction; each end waits for the one before."""
        self._faults = faults or FaultHooks()
        self._settings = settings
        self._timeout_s = settings.request_timeout_ms / 1000
        self._on_fenced = on_fenced
        self._on_ended = on_ended
        self._queue: list[_Request] = []
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._failed = False
        """A transaction failed or was fenced: no new one begins."""
        self._fenced = False
        self._stopping = False
        self._identity_refused: KafkaAuthenticationFailed | None = None
        """Kafka refused this sidecar's credentials when a failed transaction asked; set
        until the writer is replaced (its ids re-initialised with working ones)."""
        self.transactions = 0
        """Transactions committed so far."""
        self._ahead: _Lane | None = None
        """The lane whose transaction was begun ahead (``_begin_ahead``) and is not
        appended yet: requests queued now have their partitions added to it."""
        self.partitions_added_ahead = 0
        """Partitions asked to be added to a transaction before their records."""
        self._linger_s = settings.transaction_linger_ms / 1000
        self._last_group = 0
        """Requests the last transaction took."""
        self._gathered: asyncio.Event | None = None
        """Set when the queue holds ``_last_group`` requests while ``_linger`` waits."""

    @property
    def fenced(self) -> bool:
        return self._fenced

    async def start(self) -> None:
        """Initialise every transactional id. Raises KafkaUnavailable, ProducerFenced."""
        started = await asyncio.gather(
            *(
                start_transactional_producer(self._settings, lane.transactional_id)
                for lane in self._lanes
            ),
            return_exceptions=True,
        )
        failure = next((r for r in started if isinstance(r, BaseException)), None)
        if failure is not None:
            for producer in started:
                if not isinstance(producer, BaseException):
                    await close_transactional_producer(
                        producer, self._timeout_s, "a lane of a writer that failed"
                    )
            raise failure
        for lane, producer in zip(self._lanes, started, strict=True):
            lane.producer = producer
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
        endings = {lane.ending for lane in self._lanes if lane.ending is not None}
        for ending in endings:
            ending.cancel()
        await asyncio.gather(*endings, return_exceptions=True)
        self._fail_queued("the sidecar is shutting down")
        self._ahead = None
        for lane in self._lanes:
            if lane.begun_ahead:
                await self._abort_begun_ahead(lane)
            await self._close_producer(lane)

    async def write(self, topic: str, records: Sequence[OutgoingKafkaRecord]) -> WriteResult:
        """Write ``records`` to ``topic`` in the next transaction; one outcome per record.

        Waits at most about twice the request timeout: a request still queued then is
        withdrawn (not appended); one whose transaction is still ending is answered
        ``maybe_appended`` and settles later (``WriteResult.final``). Never raises for
        a record.
        """
        request = _Request(topic, records)
        if self._identity_refused is not None:
            request.refuse(self._identity_refused)
            return WriteResult(request.answer.result(), request.final)
        if self._fenced or self._stopping or self._loop_task is None:
            reason = "was fenced" if self._fenced else "is not running"
            request.fail(f"the transactional producer {reason}", maybe_appended=False, settled=True)
            return WriteResult(request.answer.result(), request.final)
        self._queue.append(request)
        self._wakeup.set()
        if self._gathered is not None and len(self._queue) >= self._last_group:
            self._gathered.set()
        if self._ahead is not None:
            self._add_ahead(self._ahead, request)
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
            if self._queue and not self._failed:
                await self._linger()
                lane = self._lanes[self._next_lane]
                if lane.ending is not None:
                    await asyncio.wait({lane.ending})  # one transaction per id at a time
                if self._queue and not self._failed:
                    group, self._queue = self._queue, []
                    self._last_group = len(group)
                    # Requests queued from now on go to the transaction after this one.
                    self._ahead = None
                    group = await self._with_known_partitions(group)
                    if group:
                        await self._append(lane, group)
            if self._failed or (self._stopping and not self._queue):
                if self._last_ending is not None:
                    await asyncio.wait({self._last_ending})
                self._fail_queued("the transactional producer was fenced")
                return
            if self._queue:
                self._wakeup.set()

    async def _linger(self) -> None:
        """Wait up to ``kafka.transaction_linger_ms`` for more requests before the next
        transaction takes the queue, when requests come from several clients at once.

        Transactions commit one after the other and each takes about as long whatever it
        carries, so throughput follows how many requests a transaction takes. Requests
        answered together by one commit come back one by one over HTTP, and the first
        would begin a transaction alone; the others then form the next, and the two
        halves keep alternating. While a transaction is still in progress the wait runs
        its whole length (that is how the halves merge); otherwise it ends once the queue
        holds as many requests as the last transaction took. A lone client's request
        (nothing in progress, one request last time) never waits."""
        if self._linger_s <= 0 or self._stopping:
            return
        busy = self._last_ending is not None and not self._last_ending.done()
        if not busy and len(self._queue) >= self._last_group:
            return
        self._gathered = None if busy else asyncio.Event()
        try:
            if self._gathered is None:
                await asyncio.sleep(self._linger_s)
            else:
                await asyncio.wait_for(self._gathered.wait(), self._linger_s)
        except TimeoutError:
            pass
        finally:
            self._gathered = None

    async def _with_known_partitions(self, group: list[_Request]) -> list[_Request]:
        """The requests whose partitions the producers' metadata shows (a partition added
        moments ago shows at the next refresh); the others fail, not appended."""
        needed: dict[str, int] = {}
        for request in group:
            for record in request.records:
                needed[request.topic] = max(needed.get(request.topic, 0), record.partition + 1)
        missing: dict[str, str] = {}
        for topic, count in needed.items():
            unknown = await self._lanes_show(topic, count)
            if unknown is not None:
                missing[topic] = unknown
        for request in group:
            if request.topic in missing:
                request.fail(missing[request.topic], maybe_appended=False, settled=True)
        return [request for request in group if request.topic not in missing]

    async def prepare(self, topic: str, count: int) -> None:
        """Refresh every lane's metadata until it shows ``count`` partitions of ``topic``.

        For a change that adds partitions, called when its barrier is published: the
        sidecar holds the topic's produces until the change commits anyway, and
        otherwise the first transaction after the commit waited for these refreshes on
        the request path (100-250 ms a change on the dev cluster, more when loaded). A
        failure is left to the request path, which waits again."""
        unknown = await self._lanes_show(topic, count)
        if unknown is not None:
            _log.info("new partitions of %s not prepared: %s", topic, unknown)

    async def _lanes_show(self, topic: str, count: int) -> str | None:
        """Wait until every lane's metadata shows ``count`` partitions of ``topic``; the
        reason if one does not within the request timeout, else None.

        Every lane is asked, not only the one about to write: each producer has metadata
        of its own, and refreshing them together makes the next lanes' first transactions
        after an expansion wait for nothing."""
        waits = [
            await_partition_count(
                lane.producer.client,
                topic,
                count,
                self._timeout_s,
                backoff_s=self._settings.retry_backoff_s,
            )
            for lane in self._lanes
            if lane.producer is not None
        ]
        unknown = None
        for outcome in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(outcome, KafkaUnavailable):
                unknown = outcome.message
            elif isinstance(outcome, BaseException):
                raise outcome
        return unknown

    async def _append(self, lane: _Lane, group: list[_Request]) -> None:
        """Begin a transaction on ``lane`` with ``group``'s records and wait until they are
        appended; then leave its commit to a task of its own (``_end``)."""
        deliveries: list[list[QueuedRecord | SendFailed]] = []
        self._faults.before_send(self.transactional_ids)
        begun, lane.begun_ahead = lane.begun_ahead, False
        try:
            if begun and not in_transaction(lane.producer):
                # Adding a partition ahead met an error (a refused ACL): end what was
                # begun, so that the records meet the error as they would have.
                await lane.producer.abort_transaction()
                begun = False
            if not begun:
                await lane.producer.begin_transaction()
            deliveries = await enqueue_all(
                lane.producer, [(request.topic, request.records) for request in group]
            )
            await self._begin_ahead()
            # The commit is asked for only once every batch is appended: aiokafka sends a
            # requested commit as soon as the pending batches are appended, also after the
            # caller gave up waiting (seen: records of a commit that had timed out,
            # answered "not written", became visible past a boundary let pass meanwhile).
            pending = _batches(deliveries)
            if pending:
                async with asyncio.timeout(self._timeout_s):
                    await asyncio.wait(pending)
            for delivery in pending:  # all done: a failed batch keeps the commit from going out
                if delivery.cancelled():
                    raise KafkaUnavailable("a batch of the transaction was cancelled")
                if (failure := delivery.exception()) is not None:
                    raise failure
        except Exception as exc:  # whatever it was, the transaction cannot commit now
            _retrieve_all(deliveries)
            # The commit was never asked for: nothing of it can become visible.
            await self._transaction_failed(lane, group, exc, commit_sent=False)
            return
        previous = self._last_ending
        lane.ending = self._last_ending = asyncio.create_task(
            self._end(lane, group, deliveries, previous)
        )
        self._next_lane = (self._next_lane + 1) % len(self._lanes)

    async def _begin_ahead(self) -> None:
        """Begin the next lane's transaction while this one's records are appended, and
        add the partitions of the requests queued so far to it.

        Only when that lane's last transaction has ended (one transaction per id at a
        time). A failure is left to the lane's own turn, which meets it again."""
        if len(self._lanes) < 2 or self._failed or self._stopping:
            return
        lane = self._lanes[(self._next_lane + 1) % len(self._lanes)]
        if lane.producer is None or lane.begun_ahead:
            return
        if lane.ending is not None and not lane.ending.done():
            return
        if not ready_to_begin(lane.producer):
            return  # it would wait (for a producer id): this transaction's records must not
        try:
            await lane.producer.begin_transaction()
        except Exception as exc:  # the producer is in no state to begin: its turn will say
            _log.debug("%s: no transaction begun ahead: %s", lane.transactional_id, exc)
            return
        lane.begun_ahead = True
        self._ahead = lane
        for request in self._queue:
            self._add_ahead(lane, request)

    def _add_ahead(self, lane: _Lane, request: _Request) -> None:
        partitions = {record.partition for record in request.records}
        self.partitions_added_ahead += add_partitions_ahead(
            lane.producer, request.topic, partitions
        )

    async def _abort_begun_ahead(self, lane: _Lane) -> None:
        """End a transaction begun ahead whose records never came (the writer stops):
        its markers are written now, not when the transaction times out."""
        lane.begun_ahead = False
        try:
            async with asyncio.timeout(self._timeout_s):
                await lane.producer.abort_transaction()
        except Exception as exc:  # fenced, or the cluster away: the timeout aborts it
            _log.info("aborting %s's transaction begun ahead: %s", lane.transactional_id, exc)

    async def _end(
        self,
        lane: _Lane,
        group: list[_Request],
        deliveries: list[list[QueuedRecord | SendFailed]],
        previous: asyncio.Task[bool] | None,
    ) -> bool:
        """Commit the transaction once the previous one has committed; abort it if that
        failed. True if it committed."""
        if previous is not None:
            await asyncio.wait({previous})
            if previous.cancelled() or previous.exception() is not None or not previous.result():
                await self._abort(lane, group)
                return False
        try:
            self._faults.before_commit(self.transactions, self.transactional_ids)
            async with asyncio.timeout(self._timeout_s):
                await lane.producer.commit_transaction()
        except Exception as exc:  # whatever it was, the transaction is in doubt
            await self._transaction_failed(lane, group, exc, commit_sent=True)
            return False
        self.transactions += 1
        self._on_ended(TX_COMMITTED)
        for request, delivered in zip(group, deliveries, strict=True):
            request.settle([_outcome(d) for d in delivered])
        return True

    async def _abort(self, lane: _Lane, group: list[_Request]) -> None:
        """End a transaction that must not commit (an earlier one failed): its records
        were appended but never become visible."""
        reason = "an earlier transaction of this sidecar failed"
        self._on_ended(TX_ABORTED)
        for request in group:
            request.fail(f"not committed: {reason}", maybe_appended=False, settled=False)
        try:
            async with asyncio.timeout(self._timeout_s):
                await lane.producer.abort_transaction()
        except FENCED_ERRORS:
            pass  # whoever fenced the id aborted the transaction before they answered
        except Exception as exc:
            _log.warning("aborting a transaction of %s failed: %s", lane.transactional_id, exc)
            await self._reset(lane)
        for request in group:
            request.settle(request.answer.result())

    async def _transaction_failed(
        self, lane: _Lane, group: list[_Request], exc: BaseException, *, commit_sent: bool
    ) -> None:
        self._failed = True  # begin nothing more; later transactions abort
        reason = str(exc) or type(exc).__name__
        self._on_ended(TX_FENCED if isinstance(exc, FENCED_ERRORS) else TX_FAILED)
        if isinstance(exc, FENCED_ERRORS):
            # Whoever fenced us completed or aborted the transaction before their own
            # initialisation returned: settled, though a commit sent before may have won.
            _log.warning("transactional id %s fenced: %s", lane.transactional_id, reason)
            for request in group:
                request.fail(
                    f"this sidecar's producer was fenced: {reason}",
                    maybe_appended=commit_sent,
                    settled=True,
                )
            self._mark_fenced()
            return
        # In doubt: answer now, and settle by re-initialising the id.
        _log.warning("transaction of %s failed: %s", lane.transactional_id, reason)
        refusal = None
        if not commit_sent and not isinstance(exc, BrokerResponseError):
            # No answer from Kafka, and nothing of it can become visible: if Kafka now
            # refuses the credentials, say so rather than "unavailable", and refuse the
            # requests after it at once (their transaction could not begin either).
            refusal = await refused_identity(self._settings)
        if refusal is not None:
            _log.warning("Kafka refuses this sidecar's identity: %s", refusal.message)
            self._identity_refused = refusal
            for request in group:
                request.refuse(refusal)
            queued, self._queue = self._queue, []
            for request in queued:
                request.refuse(refusal)
        else:
            for request in group:
                request.fail(
                    f"transaction failed: {reason}", maybe_appended=commit_sent, settled=False
                )
        await self._reset(lane)
        for request in group:
            request.settle(request.answer.result())
        # The re-initialisation may have undone a fence this process could not see (see
        # the module's docstring): nothing more is written under these ids.
        _log.warning("%s settled a doubt: retired, to be replaced", lane.transactional_id)
        self._mark_fenced()

    async def _reset(self, lane: _Lane) -> None:
        """Replace the lane's producer by one under the same id: Kafka completes or aborts
        the open transaction (and writes its markers) before it initialises the new one.
        Retried until it works, the id turns out fenced, or the writer stops."""
        await self._close_producer(lane)
        while True:
            try:
                lane.producer = await start_transactional_producer(
                    self._settings, lane.transactional_id
                )
                self._identity_refused = None  # it connected: the credentials work again
                return
            except ProducerFenced:
                self._mark_fenced()
                return
            except (KafkaUnavailable, KafkaAuthenticationFailed, ConfigError) as exc:
                # Refused credentials too: they may be fixed (a password file is read
                # again for every new producer), and until then nothing is written.
                _log.warning("re-initialising %s failed, retrying: %s", lane.transactional_id, exc)
                if self._stopping:
                    return
                await asyncio.sleep(self._settings.reset_backoff_s)

    def _mark_fenced(self) -> None:
        self._failed = True
        if not self._fenced:
            self._fenced = True
            self._on_fenced()

    def _fail_queued(self, message: str) -> None:
        queued, self._queue = self._queue, []
        for request in queued:
            request.fail(message, maybe_appended=False, settled=True)

    async def _close_producer(self, lane: _Lane) -> None:
        producer, lane.producer = lane.producer, None
        if producer is not None:
            await close_transactional_producer(producer, self._timeout_s, lane.transactional_id)


async def close_transactional_producer(producer: Any, timeout_s: float, what: str) -> None:
    """Stop ``producer`` within ``timeout_s``; a failure is logged (``what`` names the
    producer), not raised."""
    try:
        await asyncio.wait_for(producer.stop(), timeout_s)
    except (KafkaError, TimeoutError) as exc:
        _log.info("closing transactional producer %s: %s", what, exc)


def _batches(deliveries: list[list[QueuedRecord | SendFailed]]) -> set[asyncio.Future[Any]]:
    """The deliveries of the batches the records were queued in (a SendFailed was
    refused before it was queued: no batch to wait for)."""
    return {
        delivery.batch
        for delivered in deliveries
        for delivery in delivered
        if isinstance(delivery, QueuedRecord)
    }


def _retrieve_all(deliveries: list[list[QueuedRecord | SendFailed]]) -> None:
    for batch in _batches(deliveries):
        # Nobody reads these outcomes: keep asyncio from logging them.
        batch.add_done_callback(_retrieve)


def _retrieve(delivery: asyncio.Future[Any]) -> None:
    if not delivery.cancelled():
        delivery.exception()


def _outcome(delivery: QueuedRecord | SendFailed) -> Outcome:
    if isinstance(delivery, SendFailed):
        return delivery
    if not delivery.batch.done():
        # The commit returned, so every batch was flushed: cannot happen.
        return SendFailed("no acknowledgement after the commit", maybe_appended=True)
    return delivery.outcome()
