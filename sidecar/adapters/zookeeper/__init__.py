"""The sidecars' shared metadata in ZooKeeper: one asyncio adapter over kazoo.

Znodes, under a configurable root (default ``/ordered``); every value is UTF-8 JSON
in the shapes of ``sidecar.core.serialization``::

    <root>/sidecars/<id>                     ephemeral: a live sidecar's info, with the
                                             transactional ids it writes with now
    <root>/producers/<transactional id>      {"sidecar": id}: every transactional id a
                                             sidecar registered and has not retired; the
                                             ones no live sidecar names are fenced by the
                                             next change (DESIGN §5)
    <root>/topics/<t>                        {"config": ..., "current_generation": g}, and
                                             "folded": {"first_generation", "waits"} once
                                             the log was compacted (docs/compaction.md)
    <root>/topics/<t>/generations/<g>        a committed generation; g as %010d; those
                                             before "first_generation" are deleted
    <root>/topics/<t>/partitions             {"modes": [...], "delete_after": [float|null, ...]}
    <root>/topics/<t>/pending                the pending barrier; only while one is pending
    <root>/topics/<t>/truncations            {"confirmed": [[g, p, offset, epoch], ...]}: lost
                                             boundaries an operator confirmed (KIP-320)
    <root>/topics/<t>/barrier/<g>/<id>       {"acked": {"<partition>": next_offset}}
    <root>/ops/<t>                           journal of the change in progress (or last done),
                                             written compare-and-set by znode version
    <root>/locks/<t>                         ephemeral {"owner", "purpose", "acquired_at"}: the
                                             topic's change lock; one change at a time
    <root>/groups/<group>                    a consumer group some sidecar consumes for
    <root>/groups/<group>/waits/<t>:<q>:<b>:<instance>
                                             ephemeral: an instance waits for the group
                                             to consume partition q of t up to offset b
    <root>/groups/<group>/revoked/<t>:<q>:<g>
                                             the group's app acknowledged keys_revoked of
                                             partition q of t for change g (written once)

One module per domain, each a small class over one shared kazoo client, behind the
front class ``MetadataStore`` (``store``)::

    connection   the kazoo client, the root, the thread hop, the paths of the layout above
    session      start and stop, the session's state and its listeners
    sidecars     sidecars and producers: registration, the live sets
    topics       topics and generations: create, read, watch, compact, partitions,
                 truncations
    operations   the change journal, its take-over, the change locks and leftover locks
    barriers     publish, ack, acks, withdraw; the commit of a generation
    groups       the groups, their gate waits and their keys_revoked acknowledgements
"""

from sidecar.adapters.zookeeper.operations import LockHolder
from sidecar.adapters.zookeeper.store import MetadataStore

__all__ = ["LockHolder", "MetadataStore"]
