"""How the Kafka gateway's failures come out: aiokafka's errors as the
``sidecar.core.errors`` hierarchy (``_translated``), the adapter's own exceptions
(``SendFailed``, ``TopicExists``), the per-partition error codes of the leader-epoch
requests, and ``refused_identity``, which tells a refused credential or certificate from
a cluster that is away."""

from __future__ import annotations

import asyncio

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    InvalidConfigurationError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    PolicyViolationError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.errors import ProducerFenced as KafkaProducerFenced

from sidecar.adapters.kafka_security import diagnose
from sidecar.config import ConfigError, KafkaSettings
from sidecar.core.errors import (
    KafkaAuthenticationFailed,
    KafkaBadRequest,
    KafkaFailure,
    KafkaNotAuthorized,
    KafkaUnavailable,
    SidecarError,
    UnknownTopic,
)

FENCED_ERRORS = (KafkaProducerFenced, TransactionalIdAuthorizationFailed)
"""After these a transactional id belongs to another producer (or to none): never retried."""


class SendFailed(Exception):
    """A send known to have failed (``maybe_appended`` False) or whose outcome is unknown.

    ``maybe_appended`` is True when the request may have reached the broker (a timeout,
    a lost connection): the record may still be appended, later, in order. ``retriable``
    is False when Kafka refused the record itself (too large, not authorised).
    """

    def __init__(
        self,
        message: str,
        *,
        maybe_appended: bool,
        retriable: bool | None = None,
        not_authorized: bool = False,
        identity_refused: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.maybe_appended = maybe_appended
        self.retriable = maybe_appended if retriable is None else retriable
        """Sending the record again is what the client should do (nothing was refused)."""
        self.not_authorized = not_authorized
        """Kafka's ACLs refused this sidecar's principal the topic (nothing was appended)."""
        self.identity_refused = identity_refused
        """Kafka refused this sidecar's credentials or certificate when it connected
        again (nothing was appended); ``message`` names the setting."""


class TopicExists(Exception):
    """create_topic found the topic already there."""


async def refused_identity(settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
    """Whether Kafka now refuses this sidecar's credentials or certificate: one new
    connection to a bootstrap broker (``kafka_security.diagnose``), given half the
    request timeout (None when it could not tell by then).

    aiokafka's clients swallow a refused connection (they log it, and wait for the node
    as for one that is away), so a credential revoked while the sidecar runs shows as
    requests that time out; a failure that Kafka did not answer asks this before it is
    reported as Kafka being unavailable. A PLAINTEXT connection presents nothing to refuse:
    it is not asked (a broker outage would only wait for the connection)."""
    if settings.security.protocol == "PLAINTEXT":
        return None
    try:
        return await asyncio.wait_for(diagnose(settings), settings.request_timeout_ms / 2000)
    except TimeoutError:
        return None
    except ConfigError as exc:  # a password file that went away meanwhile
        return KafkaAuthenticationFailed(str(exc))


class _LeaderUnknown(KafkaError):  # type: ignore[misc]
    """A partition has no leader now, or the one asked is no longer it (retriable)."""

    retriable = True


# Per-partition answers that a fresh look at the metadata may cure: the leader moved
# (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH), the metadata is ahead of the broker
# (UNKNOWN_LEADER_EPOCH), a new leader does not know its high watermark yet
# (LEADER_NOT_AVAILABLE, OFFSET_NOT_AVAILABLE), a replica is being moved.
_LEADER_CHANGING = frozenset({5, 6, 9, 56, 74, 75, 78})


def _raise_for_partition(error_code: int, what: str) -> None:
    if not error_code:
        return
    if error_code in _LEADER_CHANGING:
        raise _LeaderUnknown(f"{what}: error {error_code} from the partition's leader")
    error = _error_for_code(error_code, what)
    raise error


def _error_for_code(code: int, message: str) -> KafkaError:
    return for_code(code)(message)


# ACLs refuse this sidecar's principal: an operator's matter, answered 503, never 500.
_NOT_AUTHORIZED = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
)

# Errors Kafka answers when the request itself is wrong: the caller's mistake, not a
# failure of the cluster.
_REFUSED_AS_INVALID = (
    InvalidConfigurationError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    PolicyViolationError,
)


def _principal_refused(settings: KafkaSettings, exc: KafkaError) -> KafkaNotAuthorized:
    security = settings.security
    if security.sasl and security.sasl_mechanism != "OAUTHBEARER":
        principal = f"User:{security.sasl_username} (kafka.security.sasl_username)"
    elif security.ssl_certfile:
        principal = "the subject of kafka.security.ssl_certfile"
    else:
        principal = "this sidecar's principal"
    return KafkaNotAuthorized(
        f"kafka.security: {principal} is not authorized by Kafka's ACLs "
        f"({type(exc).__name__}); it needs the ACLs listed in the README"
    )


def _translated(exc: KafkaError, what: str) -> SidecarError:
    if isinstance(exc, _NOT_AUTHORIZED):
        return KafkaNotAuthorized(f"{what}: {type(exc).__name__}: not allowed by Kafka's ACLs")
    if isinstance(exc, SaslAuthenticationFailed):
        return KafkaAuthenticationFailed(f"{what}: Kafka refused this sidecar's credentials")
    if isinstance(exc, UnknownTopicOrPartitionError):
        return UnknownTopic(f"{what}: {exc}")
    if isinstance(exc, _REFUSED_AS_INVALID):
        return KafkaBadRequest(f"{what}: {exc}")
    if exc.retriable or isinstance(exc, KafkaTimeoutError):
        return KafkaUnavailable(f"{what}: {exc}")
    return KafkaFailure(f"{what}: {exc}")
