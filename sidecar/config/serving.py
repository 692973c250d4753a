"""The sections of what the sidecar serves its apps: ``http`` (the data-plane and
operations listeners), ``produce``, ``changes`` (partition-count changes, retirement,
housekeeping) and ``consumer`` (the consume path)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.core.placement import HeaderFormat

ACCESS_LOG_MODES = ("off", "errors", "all")
HEADER_FORMATS = tuple(header_format.value for header_format in HeaderFormat)


@dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str = "127.0.0.1"
    port: int = 8082
    max_body_bytes: int = 8 * 1024 * 1024
    admin_enabled: bool = False
    admin_token: str = field(default="", repr=False)
    max_connections: int = 1000
    """Connections open at once; one more is answered 503 and closed unread."""
    header_read_timeout_s: float = 10.0
    """A request head must be complete this long after the connection opened (or after
    its first byte on a kept-alive connection), or the connection is closed."""
    body_read_timeout_s: float = 30.0
    """A request body must be complete this long after its head, or 408 and closed."""
    keepalive_timeout_s: float = 75.0
    """An idle kept-alive connection is closed after this long (nginx's default: longer
    than the idle time most HTTP clients reuse a connection for)."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM, how long requests in progress may take before the server closes."""
    lingering_time_s: float = 2.0
    """aiohttp's ``lingering_time``: after an answer that closes a connection whose body
    was not read (a 408, a 413), how long the rest of the body is read and dropped so the
    client can read the answer. aiohttp's default, 10 s, would keep a connection whose
    body never comes open that much longer."""
    refusal_linger_s: float = 1.0
    """How long a connection refused over ``max_connections`` is kept half-closed so the
    client reads its 503 (closing with its request unread would reset the connection and
    lose the answer)."""
    access_log: str = "errors"
    """``errors``: one line per request answered 400 or above; ``all``: every request;
    ``off``: none (logger ``sidecar.access``, INFO)."""
    ops_host: str = "127.0.0.1"
    """The operations listener's address (``/healthz``, ``/readyz``, ``/metrics`` and
    nothing else). In Kubernetes ``0.0.0.0``, so kubelet and Prometheus reach it at the
    pod IP; the data plane stays on ``host``."""
    ops_port: int = 8081
    data_token: str = field(default="", repr=False)
    """When set, every data-plane request (produce, consume, v3, admin) needs
    ``X-Sidecar-Token: <token>``. Required when ``host`` is not a loopback address:
    the data plane is the app's alone."""


@dataclass(frozen=True, slots=True)
class ProduceSettings:
    hold_timeout_s: float = 30.0
    """How long a produce may wait for a barrier or a ZooKeeper reconnect before 503."""
    barrier_timeout_s: float = 20.0
    """How long a coordinator waits for every live sidecar to ack before rolling back."""
    tombstone_cache_size: int = 100_000
    unmanaged_cache_size: int = 10_000
    """Most "this topic is not managed" answers kept (topic names come from clients, so
    the cache is bounded; the oldest answer is forgotten first)."""
    unmanaged_cache_s: float = 1.0
    """How long "this topic is not managed" is believed without asking ZooKeeper again
    (a new managed topic is also noticed at once by a watch). Shorter than the session
    timeout, so a sidecar resumed after a pause past its session asks again."""
    writer_retry_s: float = 0.5
    """Pause between tries of replacing a fenced or lost transactional producer."""
    stream_max_in_flight: int = 100
    """Records of one REST v3 streaming request being written at once; the next record
    is read from the request when the oldest has been answered."""
    stream_idle_timeout_s: float = 300.0
    """A REST v3 stream that sends no byte this long is ended (with a 408 entry)."""
    header_format: str = "stamp"
    """How a managed record's routing is written: ``stamp``, one ``ordered.stamp``
    header, or ``separate``, the four headers sidecars before the stamp read. Every
    sidecar reads both; set ``separate`` while a rolling upgrade still runs old ones."""


@dataclass(frozen=True, slots=True)
class ChangeSettings:
    """Partition-count changes, retirement and the housekeeping that resumes them."""

    barrier_poll_s: float = 0.02
    """How often a coordinator re-reads barrier acks (a watch would save little here:
    the barrier lasts as long as the slowest sidecar's in-flight sends)."""
    action_retry_s: float = 0.5
    """Pause before a coordinator retries a step that failed (Kafka or ZooKeeper away)."""
    lock_timeout_s: float = 10.0
    """How long a change waits for the topic's lock. Housekeeping (retirement,
    resumption) holds it briefly; a change in progress is refused at once from its
    journal, not by timing out on the lock."""
    retirement_lock_timeout_s: float = 0.5
    """How long retirement waits for the topic's lock (it tries again next round)."""
    housekeeping_interval_s: float = 2.0
    """How often a sidecar looks for changes whose coordinator died and for partitions
    to retire (every sidecar does; the topic lock makes one of them act)."""
    warm_within_s: float = 2.0
    """How long an expansion may spend, before its barrier holds any produce, giving
    each partition it adds a first replicated write (aborted: nobody reads it), which
    otherwise the first produces after the commit wait for. 0 skips it."""
    compaction_interval_s: float = 300.0
    """How often a sidecar tries to compact each managed topic's generation log: fold
    the generations whose records retention or DeleteRecords removed from every
    partition (docs/compaction.md). Every sidecar tries, with jitter; the topic lock
    makes one of them do it, and only when something can be folded. 0: never; set 0
    while a fleet is upgraded from a version that cannot read a compacted log (README,
    "Upgrading"). The admin route and ``sidecar topics compact`` compact on demand
    whatever it is."""
    compaction_batch: int = 1000
    """The most generations one ZooKeeper multi-op folds (each deleted generation node
    adds about 70 bytes to a request ZooKeeper caps at ``jute.maxbuffer``, 1 MiB by
    default); a longer prefix is folded by several in a row."""


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """The consume path's tunables (REST consumer instances)."""

    gate_recheck_s: float = 0.05
    """How often a waiting poll re-reads the group's committed offsets."""
    buffer_limit: int = 2000
    """Records buffered per partition before fetching from it pauses."""
    auto_commit_interval_s: float = 5.0
    """How often an auto-committing instance commits what it delivered."""
    metadata_max_age_ms: int = 3000
    """How soon an instance's Kafka consumer notices added partitions (and rebalances)."""
    rebalance_window_s: float = 0.5
    """Changes of a topic's assignable partitions this close together make one
    rebalance of the groups reading it (each rebalance pauses the whole group)."""
    revoke_ack_wait_s: float = 10.0
    """How long a rebalance waits for the app to acknowledge keys_revoked events."""
    reading_start_wait_s: float = 5.0
    """How long a rebalance of a "latest" or "none" instance waits to read the group's
    commits and the log starts of a managed topic, to begin a partition a change made
    at its log start (``sidecar.core.reading_start``); past it, ``auto.offset.reset``
    places the partitions (logged). The rebalance waits meanwhile."""
    fetch_grace_s: float = 0.05
    """How much longer than its own timeout a poll waits for the Kafka fetch."""
    callback_retry_s: float = 0.2
    """Pause between attempts of a hand-off callback."""
    instance_idle_timeout_s: float = 300.0
    """A consumer instance unused this long is closed (REST Proxy's instance timeout)."""
    max_poll_bytes: int = 64 * 1024 * 1024
    """The largest ``max_bytes`` a records request may ask for."""
    callback_patience_s: float = 30.0
    """How long a hand-off callback that a release or a commit waits for is retried, at
    least (longer if ``callback_timeout_s`` of the instance is)."""
    revoke_ack_poll_s: float = 0.02
    """How often a rebalance that waits for keys_revoked acknowledgements looks again."""
    idle_check_interval_s: float = 10.0
    """The longest pause between two looks for idle instances (half of
    ``instance_idle_timeout_s`` if that is shorter)."""
    stall_fence_s: float = 5.0
    """After this sidecar's event loop did not run for this long (a stopped process, a
    paused VM), its consumer instances tell no key hand-off and release nothing until
    their group has rebalanced (they ask it to): meanwhile the group may have given
    their partitions to another instance, whose app is told. Below Kafka's consumer
    session timeout (10 s by default); 0: off."""
