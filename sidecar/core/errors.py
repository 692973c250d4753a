"""One error hierarchy for the whole sidecar.

Behaviour lives in class attributes, as in aiokafka's ``errors.py``: ``retriable``
says a client may retry the same request unchanged, ``http_status`` and
``error_code`` are what the HTTP layer answers (Confluent REST Proxy style:
``{"error_code": 40401, "message": "..."}``). The HTTP layer maps errors in exactly
one place; nothing below it knows about HTTP responses.
"""

from __future__ import annotations

from typing import ClassVar


class SidecarError(Exception):
    """Root of every error the sidecar raises on purpose."""

    http_status: ClassVar[int] = 500
    error_code: ClassVar[int] = 50000
    retriable: ClassVar[bool] = False
    default_message: ClassVar[str] = "internal error"
    headers: ClassVar[tuple[tuple[str, str], ...]] = ()
    """Response headers the status needs (a challenge, a Retry-After), set by the HTTP layer."""
    fatal_at_start: ClassVar[bool] = False
    """Raised while the sidecar connects at start, it ends the process (one line, exit 2)
    instead of being retried: the cluster refused this sidecar's identity, and trying
    again cannot help until an operator fixes its settings."""

    def __init__(self, message: str | None = None) -> None:
        self.message = message or self.default_message
        super().__init__(self.message)


# 400: the request itself is wrong -----------------------------------------------------


class BadRequest(SidecarError):
    """Malformed request: unparsable JSON, wrong shape, bad query parameter."""

    http_status = 400
    error_code = 40001
    default_message = "malformed request"


class KafkaBadRequest(SidecarError):
    """Kafka refused the request as the caller's mistake (an invalid replication factor, an
    unknown topic config, a policy violation); the message is Kafka's. Code as REST Proxy's
    ``KAFKA_BAD_REQUEST_ERROR_CODE``."""

    http_status = 400
    error_code = 40002
    default_message = "Kafka refused the request as invalid"


class InvalidName(BadRequest):
    """A topic, group, instance or sidecar name that cannot be used (``core.names``)."""

    error_code = 40003
    default_message = "invalid name"


class InvalidRecord(SidecarError):
    """A record is well-formed JSON but unusable (bad base64, missing value, ...)."""

    http_status = 422
    error_code = 42201
    default_message = "invalid record"


class InvalidConsumerConfig(BadRequest):
    """A consumer instance setting Kafka or this sidecar cannot serve (e.g. format avro)."""

    http_status = 422
    error_code = 42204
    default_message = "invalid consumer configuration"


class NotAcceptable(SidecarError):
    """The Accept header asks for another embedded format than the instance's."""

    http_status = 406
    error_code = 40601
    default_message = "the consumer instance cannot answer in the accepted format"


class IdempotencyKeyReused(SidecarError):
    """An idempotency key sent again with a different request (a client bug, not a retry)."""

    http_status = 422
    error_code = 42202
    default_message = "idempotency key reused with a different request"


class UnsupportedMediaType(SidecarError):
    http_status = 415
    error_code = 41501
    default_message = "unsupported content type"


class PayloadTooLarge(SidecarError):
    http_status = 413
    error_code = 41301
    default_message = "request body is larger than the configured limit"


class RequestTimeout(SidecarError):
    """The request body did not arrive in time (``http.body_read_timeout_s``)."""

    http_status = 408
    error_code = 40801
    default_message = "the request did not arrive in time"


class NotAuthenticated(SidecarError):
    """Admin call without the configured token, or with another one (RFC 9110: 401 with a
    ``WWW-Authenticate`` challenge; REST Proxy's authentication code)."""

    http_status = 401
    error_code = 40101
    default_message = "not authenticated"
    headers = (("WWW-Authenticate", 'Bearer realm="ordered-sidecar admin"'),)


class DataTokenMissing(SidecarError):
    """A data-plane request without ``http.data_token`` (in ``X-Sidecar-Token``), on a
    sidecar whose data plane listens beyond loopback."""

    http_status = 401
    error_code = 40102
    default_message = "missing or wrong data-plane token"


class AdminDisabled(SidecarError):
    http_status = 403
    error_code = 40302
    default_message = "admin endpoints are disabled on this sidecar"


# 404: something named does not exist ---------------------------------------------------


class UnknownTopic(SidecarError):
    http_status = 404
    error_code = 40401
    default_message = "topic not found"


class UnknownPartition(SidecarError):
    http_status = 404
    error_code = 40402
    default_message = "partition not found"


class UnknownConsumerInstance(SidecarError):
    http_status = 404
    error_code = 40403
    default_message = "consumer instance not found"


class UnknownCluster(SidecarError):
    """A REST Proxy v3 path names a cluster other than the one the sidecar writes to."""

    http_status = 404
    error_code = 40404
    default_message = "cluster not found"


# 409 / 422: state conflicts and invalid changes ----------------------------------------


class TopicAlreadyManaged(SidecarError):
    http_status = 409
    error_code = 40901
    default_message = "topic is already managed"


class PartitionReadOnly(SidecarError):
    """The partition is marked for deletion (read-only) or removed: no new writes."""

    http_status = 409
    error_code = 40902
    default_message = "partition does not accept writes"


class FencedGeneration(SidecarError):
    """The request names an older generation/count than the current one (KIP-320 FENCED)."""

    http_status = 409
    error_code = 40910
    retriable = True
    default_message = "produce fenced: the topic's partition count changed"

    def __init__(
        self, message: str | None = None, *, current_generation: int = -1, current_count: int = -1
    ) -> None:
        super().__init__(message)
        self.current_generation = current_generation
        self.current_count = current_count


class InvalidGeneration(FencedGeneration):
    """The request names a generation newer than any there is, committed or pending: no
    sidecar can have answered with it, so it is the app's mistake, not a race. The body
    names the current generation and count, as a fenced answer does."""

    error_code = 40911
    retriable = False
    default_message = "the expected generation does not exist"


class ConsumerStateConflict(SidecarError):
    """The consumer instance is not in a state for this call (not subscribed, an event
    to acknowledge first, already exists)."""

    http_status = 409
    error_code = 40940
    default_message = "the consumer instance is not in a state for this request"


class OperationInProgress(SidecarError):
    """Another partition-count change of this topic is running (one at a time)."""

    http_status = 409
    error_code = 40920
    retriable = True
    default_message = "another partition-count change is in progress for this topic"


class ChangeTakenOver(OperationInProgress):
    """The change's journal was moved on by another coordinator (this one lost its lock,
    e.g. paused past its ZooKeeper session): it stops, the other finishes the change."""

    error_code = 40921
    default_message = "another coordinator took the partition-count change over"


class ChangeRolledBack(SidecarError):
    """A partition-count change was rolled back (barrier timeout, CreatePartitions failure).

    Nothing changed; the same request may be sent again.
    """

    http_status = 409
    error_code = 40930
    retriable = True
    default_message = "the partition-count change was rolled back"


class BoundaryTruncated(SidecarError):
    """A boundary of the topic's generation log is no longer reached by its partition's
    log (KIP-320): an unclean leader election cut acknowledged records below it. The
    topic's changes and retirements are refused; retrying cannot help."""

    http_status = 409
    error_code = 40950
    default_message = "a boundary of the topic was lost to log truncation"


class NoTruncationToConfirm(SidecarError):
    """An operator confirmed the lost boundaries of a topic none of whose boundaries is
    lost (or all of whose losses were confirmed already): nothing was written."""

    http_status = 409
    error_code = 40951
    default_message = "no lost boundary of the topic awaits confirmation"


class InvalidPartitionCount(SidecarError):
    """KIP-195 INVALID_PARTITIONS: not an increase, below N, or otherwise impossible."""

    http_status = 422
    error_code = 42210
    default_message = "invalid partition count"


# 5xx: the sidecar cannot serve now -----------------------------------------------------


class UnknownGeneration(SidecarError):
    """The request names a newer generation than this sidecar knows (KIP-320 UNKNOWN)."""

    http_status = 503
    error_code = 50310
    retriable = True
    default_message = "unknown generation: this sidecar is refreshing its metadata"


class MetadataUnavailable(SidecarError):
    """ZooKeeper session suspended or lost: managed topics cannot be written safely."""

    http_status = 503
    error_code = 50320
    retriable = True
    default_message = "topic metadata unavailable: coordination service unreachable"


class ProduceHoldTimeout(SidecarError):
    """A produce stayed held (barrier or reconnect) longer than the configured limit."""

    http_status = 503
    error_code = 50330
    retriable = True
    default_message = "produce held too long while the partition count changes"


class CallbackFailed(SidecarError):
    """The app's hand-off callback did not answer 2xx in time; nothing moved past it."""

    http_status = 503
    error_code = 50340
    retriable = True
    default_message = "the app's hand-off callback failed"


class NotReady(SidecarError):
    """The sidecar is still starting: Kafka, ZooKeeper or its transactional producers
    are not there yet (``/readyz`` says which). It keeps trying on its own."""

    http_status = 503
    error_code = 50360
    retriable = True
    default_message = "the sidecar is starting: its dependencies are not ready yet"
    headers = (("Retry-After", "1"),)


class TooManyConnections(SidecarError):
    """The sidecar has ``http.max_connections`` open; this one is refused unread."""

    http_status = 503
    error_code = 50303
    retriable = True
    default_message = "too many connections"
    headers = (("Retry-After", "1"),)


class KafkaUnavailable(SidecarError):
    """A retriable Kafka error (leader not available, timeout, ...)."""

    http_status = 503
    error_code = 50002
    retriable = True
    default_message = "kafka unavailable"


class ProducerFenced(SidecarError):
    """This sidecar's transactional producer was fenced (a coordinator took it for a
    zombie); nothing of the request became visible, and the sidecar is re-registering."""

    http_status = 503
    error_code = 50350
    retriable = True
    default_message = "this sidecar's producer was fenced; it is re-registering"


class KafkaAuthenticationFailed(SidecarError):
    """Kafka refused this sidecar's credentials or client certificate, or the sidecar
    refused the broker's certificate (untrusted, expired, another host's). Nothing was
    written; an operator must fix ``kafka.security``. The message names the setting
    and never holds a secret."""

    fatal_at_start = True
    http_status = 503
    error_code = 50370
    default_message = "Kafka refused this sidecar's credentials"


class KafkaNotAuthorized(SidecarError):
    """Kafka's ACLs do not let this sidecar's principal do what the request needs (write
    or read the topic, create it, join the group). Nothing was written."""

    fatal_at_start = True
    http_status = 503
    error_code = 50371
    default_message = "this sidecar's Kafka principal is not authorized for the request"


class MetadataNotAuthorized(SidecarError):
    """ZooKeeper refused this sidecar's identity (authentication failed, or the znodes'
    ACLs do not let it write): topic metadata cannot be changed. Nothing was written."""

    fatal_at_start = True
    http_status = 503
    error_code = 50321
    default_message = "ZooKeeper refused this sidecar's identity"


class KafkaFailure(SidecarError):
    """A non-retriable Kafka error."""

    http_status = 500
    error_code = 50001
    default_message = "kafka error"


class ShuttingDown(SidecarError):
    http_status = 503
    error_code = 50301
    retriable = True
    default_message = "sidecar is shutting down"
