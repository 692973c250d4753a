"""What the components of one consumer instance share (``ConsumeState``).

As aiokafka's consumer shares one ``SubscriptionState`` between its ``Fetcher`` and its
``GroupCoordinator``, a consumer instance makes one ``ConsumeState`` and hands it to
each of its components (``Fetcher``, ``Release``, ``Offsets``, ``HandoffTeller``,
``AssignmentNotices``): where it stands in each partition and the leader epochs of
what it read there, its Kafka consumer, what it told its app, what a rebalance is
taking. A component reads and changes this state; it
holds no other component to reach theirs.

The state takes no lock. The instance owns its locks and is the only one to take
them (``sidecar.service.instance``); what the state says must be changed under the
instance's delivery lock is changed there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from sidecar.core.commit_epochs import CommitEpochs
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.errors import ConsumerStateConflict
from sidecar.core.handoff import HandoffLedger, Notice
from sidecar.core.positions import Positions
from sidecar.service.consume_context import InstanceConsumer


class NoticeQueue:
    """The rebalances an app that asked for them (``assignment_events``) has not been
    given in a response yet (and truncations of what it had read, ``TruncationNotice``),
    and the partitions whose partitions_assigned notice it has been given: only these
    release records, so the notice always comes first, even when aiokafka fetches
    before its rebalance listener runs.

    ``queue`` and ``told_assigned`` are called under the instance's delivery lock: a
    release takes the queued notices before it looks at any partition, and a partition
    marked told during a release would release records in a response without its
    notice.
    """

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._queued: list[Notice] = []
        self._told_assigned: set[TopicPartition] = set()

    def must_tell_assigned(self, tp: TopicPartition, *, manual: bool) -> bool:
        """True while ``tp``'s records must wait for its partitions_assigned notice."""
        return self.enabled and not manual and tp not in self._told_assigned

    def queue(self, notice: Notice) -> None:
        """For the next response (under the instance's delivery lock)."""
        self._queued.append(notice)

    def told_assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """The app has been given (or is queued) the partitions_assigned notice of
        ``partitions``: their records may be released (under the delivery lock)."""
        self._told_assigned |= set(partitions)

    def take(self) -> list[Notice]:
        """The queued notices, for a response (under the delivery lock)."""
        queued, self._queued = self._queued, []
        return queued

    def put_back(self, notices: Sequence[Notice]) -> None:
        self._queued[:0] = notices

    def forget(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Partitions no longer assigned (all if None) need a new notice to release."""
        if partitions is None:
            self._told_assigned.clear()
        else:
            self._told_assigned -= set(partitions)


class ConsumeState:
    """One consumer instance's state, shared by its components (see the module
    docstring)."""

    def __init__(
        self,
        group: str,
        instance_id: str,
        *,
        assignment_events: bool = False,
        stalled: Callable[[], bool] = lambda: False,
    ) -> None:
        self.group = group
        self.instance_id = instance_id
        self.positions: Positions[ConsumedRecord] = Positions()
        """Where the instance stands in each partition (``sidecar.core.positions``)."""
        self.epochs = CommitEpochs()
        """The leader epochs of what was read in each partition: what a commit carries
        (``sidecar.core.commit_epochs``)."""
        self.consumer: InstanceConsumer | None = None
        """The instance's Kafka consumer, from its first subscription or manual
        assignment until it unsubscribes or closes."""
        self.manual: list[TopicPartition] = []
        """Partitions assigned by hand (no group rebalances them)."""
        self.revoking: set[TopicPartition] = set()
        """Partitions a rebalance is taking: nothing more is released from them."""
        self.ledger = HandoffLedger()
        """What the app was told of key hand-off and acknowledged (and the group's
        acknowledged revocations, as last read from ZooKeeper)."""
        self.notices = NoticeQueue(enabled=assignment_events)
        self._stalled = stalled
        self._fenced = False
        """Set after a stall of this process until the group's next assignment (see
        ``fence``)."""

    def require_consumer(self) -> InstanceConsumer:
        """Raises ConsumerStateConflict if the instance has no Kafka consumer."""
        if self.consumer is None:
            raise ConsumerStateConflict("the instance is neither subscribed nor assigned")
        return self.consumer

    # Stalls -------------------------------------------------------------------------------

    def fence(self) -> None:
        """This process stopped for a while (``StallWatch``): the group may have given
        its partitions to another instance, which tells its own app. Nothing is told or
        released until ``unfence`` (the group's next assignment)."""
        self._fenced = True

    def unfence(self) -> None:
        self._fenced = False

    @property
    def fenced(self) -> bool:
        """Fenced, or stalled right now (the stall not reported yet)."""
        return self._fenced or self._stalled()
