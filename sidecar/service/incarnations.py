"""This sidecar's transactional writer and the incarnation its ids carry.

Managed topics are written through transactional producers (DESIGN §5, fencing) whose
transactional ids (one per lane) are registered with this sidecar's ZooKeeper
registration: a coordinator fences every registered id no live sidecar names before it
reads a change's boundaries. Each new session, and each time the writer turns out
fenced, the sidecar takes new ids (an *incarnation*): it registers them and initialises
them before it writes again. The ids of a writer closed cleanly are dropped from the
registration once ZooKeeper answers.

What the topics must do meanwhile (hold produces, read their metadata again) is the
registry's (``sidecar.service.registry``), which drives recovery; this keeps only the
writer and its identity.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from sidecar.adapters.transactions import TransactionalWriter
from sidecar.config import Settings
from sidecar.core.errors import KafkaUnavailable, ProducerFenced, SidecarError
from sidecar.core.procedures import TransactionalId, incarnation_ids
from sidecar.faults import FaultHooks
from sidecar.metrics import SidecarMetrics
from sidecar.service.topic_ports import ProducerRegistration

_log = logging.getLogger(__name__)


class WriterIncarnations:
    """The writer of this sidecar's current incarnation, and the ids it registered.

    ``on_fenced`` is called (on the loop) when the writer turns out fenced or retired
    itself; ``spawn`` runs a background task of the owner's (closing a retired writer).
    """

    def __init__(
        self,
        settings: Settings,
        store: ProducerRegistration,
        metrics: SidecarMetrics,
        *,
        on_fenced: Callable[[], None],
        spawn: Callable[[Awaitable[None]], None],
        faults: FaultHooks | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._metrics = metrics
        self._on_fenced = on_fenced
        self._spawn = spawn
        self._faults = faults or FaultHooks()
        self.writer: TransactionalWriter | None = None
        """Writes managed topics; None while it is being replaced."""
        self._incarnation = 0
        self._registered: tuple[TransactionalId, ...] = ()
        """The transactional ids this sidecar's registration names (or will, once the
        store has registered again after a lost session)."""
        self._retired: set[TransactionalId] = set()
        """Ids of writers closed cleanly, to drop from the registry once ZooKeeper answers."""
        self._started_at = time.time()

    @property
    def transactional_ids(self) -> tuple[TransactionalId, ...]:
        """The ids of this incarnation's transactional producers, one per lane."""
        kafka = self._settings.kafka
        return incarnation_ids(
            kafka.client_id, self._settings.sidecar_id, self._incarnation, kafka.transaction_lanes
        )

    @property
    def writing(self) -> bool:
        """A writer is up and not fenced."""
        return self.writer is not None and not self.writer.fenced

    def _registration_info(self) -> dict[str, object]:
        return {
            "started_at": self._started_at,
            "http_port": self._settings.http.port,
            "incarnation": self._incarnation,
        }

    async def register(self) -> None:
        """Register this sidecar with its incarnation's ids (the start's first step)."""
        transactional_ids = self.transactional_ids
        await self._store.register_sidecar(
            self._settings.sidecar_id, self._registration_info(), transactional_ids
        )
        self._registered = transactional_ids

    async def first_writer(self) -> bool:
        """Start the registered ids' writer; False if Kafka's transaction coordinator
        is not there yet or fenced them (recovery then starts one in the background)."""
        try:
            self.writer = await self._start_writer(self._registered)
        except (KafkaUnavailable, ProducerFenced) as exc:
            # Kafka's transaction coordinator can take a while (a broker just restarted,
            # a loaded cluster): the sidecar starts, not ready and holding managed
            # produces, and initialises the producer in the background.
            _log.warning("transactional producer not initialised yet: %s", exc.message)
            if isinstance(exc, ProducerFenced):
                self._incarnation += 1
            return False
        return True

    async def _start_writer(
        self, transactional_ids: tuple[TransactionalId, ...]
    ) -> TransactionalWriter:
        writer = TransactionalWriter(
            self._settings.kafka,
            transactional_ids,
            on_fenced=self._on_writer_fenced,
            on_ended=self._count_transaction,
            faults=self._faults,
        )
        await writer.start()
        self._metrics.producer_incarnations.inc()
        return writer

    def _count_transaction(self, outcome: str) -> None:
        self._metrics.transactions.labels(outcome).inc()

    def _on_writer_fenced(self) -> None:
        _log.warning(
            "the transactional producer of %s was fenced or retired", self._settings.sidecar_id
        )
        self._on_fenced()

    def session_lost(self) -> None:
        """The ZooKeeper session is lost: a coordinator may fence this incarnation's ids
        any time from now on, so the next session registers a new one (the store
        registers it before it tells of the new session), and the writer retires."""
        self._incarnation += 1
        self._registered = self.transactional_ids
        self._store.prepare_registration(
            self._settings.sidecar_id, self._registration_info(), self._registered
        )
        self.retire_writer()

    def retire_writer(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            self._spawn(self._close_writer(writer))

    async def _close_writer(self, writer: TransactionalWriter) -> None:
        # Its queued transactions end (committed, or refused if fenced meanwhile); after
        # that nothing can be written with its id, which may leave the registry.
        await writer.stop()
        if not writer.fenced:
            self._retired.update(map(TransactionalId, writer.transactional_ids))

    async def ensure_writer(self) -> None:
        """A writer under registered ids, the next incarnation's if the current one is
        fenced. Raises SidecarError (ZooKeeper or Kafka away, fenced again)."""
        if self.writing:
            return
        if self.writer is not None:
            self.retire_writer()  # fenced: its id was dropped by whoever fenced it
            self._incarnation += 1
        transactional_ids = self.transactional_ids
        if self._registered != transactional_ids:
            await self._store.register_sidecar(
                self._settings.sidecar_id, self._registration_info(), transactional_ids
            )
            self._registered = transactional_ids
        try:
            self.writer = await self._start_writer(transactional_ids)
        except ProducerFenced:
            # A coordinator fenced the id between its registration and now (and dropped
            # it from the registry): writing with it would go unfenced. Take a new one.
            self._incarnation += 1
            raise

    async def forget_retired(self) -> None:
        """Drop the ids of writers closed cleanly from the registration, if ZooKeeper
        answers (else next time; meanwhile the next change fences them, harmlessly)."""
        if not self._retired:
            return
        retired = tuple(sorted(self._retired))
        try:
            await self._store.forget_producers(retired)
        except SidecarError:
            return
        self._retired.difference_update(retired)

    async def stop(self) -> None:
        """Commit what the writer has queued, close it, and drop its ids."""
        writer, self.writer = self.writer, None
        if writer is not None:
            await writer.stop()
            if not writer.fenced:
                self._retired.update(map(TransactionalId, writer.transactional_ids))
        await self.forget_retired()
