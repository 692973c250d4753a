"""``sidecar.core.errors``: the one error hierarchy and what each class tells the HTTP layer.

The expected table is the README's ("Errors"), written out here independently of the
code, so a changed status, code or retriable flag fails until both agree again. The
invariants are checked over every subclass found by walking ``SidecarError``, so a class
added later is held to them without being listed here first.
"""

from __future__ import annotations

import pytest

from sidecar.core import errors
from sidecar.core.errors import (
    AdminDisabled,
    BadRequest,
    BoundaryTruncated,
    CallbackFailed,
    ChangeRolledBack,
    ChangeTakenOver,
    ConsumerStateConflict,
    DataTokenMissing,
    FencedGeneration,
    IdempotencyKeyReused,
    InvalidConsumerConfig,
    InvalidGeneration,
    InvalidName,
    InvalidPartitionCount,
    InvalidRecord,
    KafkaAuthenticationFailed,
    KafkaBadRequest,
    KafkaFailure,
    KafkaNotAuthorized,
    KafkaUnavailable,
    MetadataNotAuthorized,
    MetadataUnavailable,
    NotAcceptable,
    NotAuthenticated,
    NotReady,
    NoTruncationToConfirm,
    OperationInProgress,
    PartitionReadOnly,
    PayloadTooLarge,
    ProduceHoldTimeout,
    ProducerFenced,
    RequestTimeout,
    ShuttingDown,
    SidecarError,
    TooManyConnections,
    TopicAlreadyManaged,
    UnknownCluster,
    UnknownConsumerInstance,
    UnknownGeneration,
    UnknownPartition,
    UnknownTopic,
    UnsupportedMediaType,
)


def hierarchy(root: type[SidecarError] = SidecarError) -> list[type[SidecarError]]:
    """``root`` and every class below it, depth first."""
    found = [root]
    for sub in root.__subclasses__():
        found.extend(hierarchy(sub))
    return found


ALL = hierarchy()

# (HTTP status, error_code, retriable), as the README's error table documents them.
EXPECTED: dict[type[SidecarError], tuple[int, int, bool]] = {
    SidecarError: (500, 50000, False),
    BadRequest: (400, 40001, False),
    KafkaBadRequest: (400, 40002, False),
    InvalidName: (400, 40003, False),
    NotAuthenticated: (401, 40101, False),
    DataTokenMissing: (401, 40102, False),
    AdminDisabled: (403, 40302, False),
    UnknownTopic: (404, 40401, False),
    UnknownPartition: (404, 40402, False),
    UnknownConsumerInstance: (404, 40403, False),
    UnknownCluster: (404, 40404, False),
    NotAcceptable: (406, 40601, False),
    RequestTimeout: (408, 40801, False),
    TopicAlreadyManaged: (409, 40901, False),
    PartitionReadOnly: (409, 40902, False),
    FencedGeneration: (409, 40910, True),
    InvalidGeneration: (409, 40911, False),
    OperationInProgress: (409, 40920, True),
    ChangeTakenOver: (409, 40921, True),
    ChangeRolledBack: (409, 40930, True),
    ConsumerStateConflict: (409, 40940, False),
    BoundaryTruncated: (409, 40950, False),
    NoTruncationToConfirm: (409, 40951, False),
    PayloadTooLarge: (413, 41301, False),
    UnsupportedMediaType: (415, 41501, False),
    InvalidRecord: (422, 42201, False),
    IdempotencyKeyReused: (422, 42202, False),
    InvalidConsumerConfig: (422, 42204, False),
    InvalidPartitionCount: (422, 42210, False),
    KafkaFailure: (500, 50001, False),
    KafkaUnavailable: (503, 50002, True),
    ShuttingDown: (503, 50301, True),
    TooManyConnections: (503, 50303, True),
    UnknownGeneration: (503, 50310, True),
    MetadataUnavailable: (503, 50320, True),
    MetadataNotAuthorized: (503, 50321, False),
    ProduceHoldTimeout: (503, 50330, True),
    CallbackFailed: (503, 50340, True),
    ProducerFenced: (503, 50350, True),
    NotReady: (503, 50360, True),
    KafkaAuthenticationFailed: (503, 50370, False),
    KafkaNotAuthorized: (503, 50371, False),
}

SERVER_OR_CLUSTER_FAILURES = {
    # The sidecar itself: a bug, starting, stopping, overloaded, its view of the metadata.
    SidecarError,
    NotReady,
    ShuttingDown,
    TooManyConnections,
    UnknownGeneration,
    ProduceHoldTimeout,
    ProducerFenced,
    # Kafka, ZooKeeper and the app's callback endpoint, which the sidecar depends on.
    KafkaFailure,
    KafkaUnavailable,
    KafkaAuthenticationFailed,
    KafkaNotAuthorized,
    MetadataUnavailable,
    MetadataNotAuthorized,
    CallbackFailed,
}

# The one class whose code does not start with its status: REST Proxy's Kafka error code
# (50002), answered 503 because it is retriable. Documented so in the README's table.
PREFIX_EXCEPTIONS = {KafkaUnavailable}


def name_of(cls: type[SidecarError]) -> str:
    return cls.__name__


# The hierarchy as a whole ---------------------------------------------------------------


def test_the_walk_finds_exactly_the_classes_the_module_defines() -> None:
    # One hierarchy in one module: a class defined elsewhere would escape this table.
    defined = {
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, SidecarError)
    }
    assert set(ALL) == defined
    assert len(ALL) == len(defined), "a class reached twice: diamond inheritance"


def test_the_expected_table_covers_every_class() -> None:
    assert set(EXPECTED) == set(ALL)


@pytest.mark.parametrize("cls", ALL, ids=name_of)
def test_each_class_answers_the_documented_status_code_and_retriability(
    cls: type[SidecarError],
) -> None:
    assert (cls.http_status, cls.error_code, cls.retriable) == EXPECTED[cls]


def test_every_error_is_an_ordinary_exception() -> None:
    # ``except Exception`` in the request handlers and the start loop must catch them.
    assert issubclass(SidecarError, Exception)


# Codes: the REST Proxy convention -------------------------------------------------------


def test_error_codes_are_unique() -> None:
    codes = [cls.error_code for cls in ALL]
    duplicated = {code for code in codes if codes.count(code) > 1}
    assert not duplicated


@pytest.mark.parametrize("cls", ALL, ids=name_of)
def test_every_class_sets_its_own_code_and_message(cls: type[SidecarError]) -> None:
    # A subclass that inherited these would answer as its parent and be told apart by
    # nothing but its Python class.
    assert "error_code" in vars(cls)
    assert "default_message" in vars(cls)


@pytest.mark.parametrize("cls", ALL, ids=name_of)
def test_codes_are_five_digits_and_statuses_are_errors(cls: type[SidecarError]) -> None:
    assert 10_000 <= cls.error_code <= 99_999
    assert 400 <= cls.http_status <= 599


@pytest.mark.parametrize("cls", [c for c in ALL if c not in PREFIX_EXCEPTIONS], ids=name_of)
def test_codes_start_with_the_status_digits(cls: type[SidecarError]) -> None:
    assert cls.error_code // 100 == cls.http_status


def test_the_one_code_that_does_not_start_with_its_status_is_the_documented_one() -> None:
    assert [cls for cls in ALL if cls.error_code // 100 != cls.http_status] == [KafkaUnavailable]
    assert (KafkaUnavailable.http_status, KafkaUnavailable.error_code) == (503, 50002)


def test_only_the_root_uses_a_bare_status_times_100() -> None:
    # status * 100 is what the HTTP layer gives aiohttp's own errors (405 -> 40500); a
    # hierarchy class there could not be told from them.
    bare = [cls for cls in ALL if cls.error_code % 100 == 0]
    assert bare == [SidecarError]


# Statuses ---------------------------------------------------------------------------------


def test_only_server_or_cluster_failures_answer_5xx() -> None:
    assert {cls for cls in ALL if cls.http_status >= 500} == SERVER_OR_CLUSTER_FAILURES


@pytest.mark.parametrize(
    "cls",
    [BadRequest, InvalidName, KafkaBadRequest, InvalidRecord, InvalidConsumerConfig],
    ids=name_of,
)
def test_the_callers_mistakes_answer_4xx(cls: type[SidecarError]) -> None:
    assert 400 <= cls.http_status < 500


def test_a_non_retriable_kafka_error_is_500_and_a_retriable_one_503() -> None:
    assert (KafkaFailure.http_status, KafkaFailure.retriable) == (500, False)
    assert (KafkaUnavailable.http_status, KafkaUnavailable.retriable) == (503, True)


# Retriable and fatal at start -------------------------------------------------------------


def test_the_retriable_client_errors_are_the_races_of_a_partition_count_change() -> None:
    # A 4xx is the request's fault, except these: another change or a count moved under
    # the request, and the same request may succeed once that settles.
    retriable_4xx = {cls for cls in ALL if cls.retriable and cls.http_status < 500}
    assert retriable_4xx == {
        FencedGeneration,
        OperationInProgress,
        ChangeTakenOver,
        ChangeRolledBack,
    }
    assert {cls.http_status for cls in retriable_4xx} == {409}


def test_an_invalid_generation_is_fenced_but_not_retriable() -> None:
    # It carries the fenced answer's fields (a subclass), but it names a generation that
    # does not exist: sending it again cannot succeed.
    assert issubclass(InvalidGeneration, FencedGeneration)
    assert FencedGeneration.retriable is True
    assert InvalidGeneration.retriable is False


def test_a_change_taken_over_is_an_operation_in_progress() -> None:
    # Callers that wait out another coordinator's change catch both with one clause.
    assert issubclass(ChangeTakenOver, OperationInProgress)
    assert ChangeTakenOver.retriable is True


def test_fatal_at_start_marks_exactly_the_refused_identities() -> None:
    fatal = {cls for cls in ALL if cls.fatal_at_start}
    assert fatal == {KafkaAuthenticationFailed, KafkaNotAuthorized, MetadataNotAuthorized}


@pytest.mark.parametrize("cls", [c for c in ALL if c.fatal_at_start], ids=name_of)
def test_a_refused_identity_is_a_non_retriable_503(cls: type[SidecarError]) -> None:
    # An operator must fix the settings: retrying unchanged cannot help, yet it is the
    # cluster's answer, not a bug of the sidecar (README: "never 500").
    assert cls.retriable is False
    assert cls.http_status == 503


def test_a_retriable_unavailable_kafka_does_not_end_the_process_at_start() -> None:
    assert KafkaUnavailable.fatal_at_start is False
    assert MetadataUnavailable.fatal_at_start is False
    assert SidecarError.fatal_at_start is False


# Headers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL, ids=name_of)
def test_headers_are_name_value_pairs_of_text(cls: type[SidecarError]) -> None:
    assert isinstance(cls.headers, tuple)
    for pair in cls.headers:
        assert len(pair) == 2
        assert all(isinstance(part, str) and part for part in pair)


def test_retry_after_is_sent_only_with_retriable_503s() -> None:
    with_retry_after = {cls for cls in ALL if any(name == "Retry-After" for name, _ in cls.headers)}
    assert with_retry_after == {NotReady, TooManyConnections}
    for cls in with_retry_after:
        assert cls.retriable
        assert cls.http_status == 503
        assert dict(cls.headers)["Retry-After"] == "1"


def test_the_admin_challenge_is_a_bearer_challenge_on_401() -> None:
    challenged = {cls for cls in ALL if any(name == "WWW-Authenticate" for name, _ in cls.headers)}
    assert challenged == {NotAuthenticated}
    assert NotAuthenticated.http_status == 401
    assert dict(NotAuthenticated.headers)["WWW-Authenticate"].startswith("Bearer realm=")


# Messages and construction ------------------------------------------------------------------


def test_default_messages_are_distinct_and_not_empty() -> None:
    messages = [cls.default_message for cls in ALL]
    assert all(message.strip() for message in messages)
    assert len(set(messages)) == len(messages)


@pytest.mark.parametrize("cls", ALL, ids=name_of)
def test_without_a_message_the_default_one_is_used(cls: type[SidecarError]) -> None:
    error = cls()
    assert error.message == cls.default_message
    assert str(error) == cls.default_message
    assert error.args == (cls.default_message,)


def test_an_empty_message_also_falls_back_to_the_default() -> None:
    # An empty body message would tell the client nothing.
    assert UnknownTopic("").message == "topic not found"


def test_the_raisers_message_is_kept() -> None:
    error = UnknownTopic("topic 'orders' is not managed by this sidecar")
    assert error.message == "topic 'orders' is not managed by this sidecar"
    assert str(error) == "topic 'orders' is not managed by this sidecar"


def test_an_error_can_be_raised_and_caught_by_its_ancestors() -> None:
    with pytest.raises(BadRequest) as caught:
        raise InvalidName("'a/b' is not a topic name")
    assert caught.value.error_code == 40003
    assert caught.value.http_status == 400


def test_a_fenced_answer_carries_the_current_generation_and_count() -> None:
    error = FencedGeneration("fenced at 3", current_generation=4, current_count=9)
    assert (error.message, error.current_generation, error.current_count) == ("fenced at 3", 4, 9)


def test_a_fenced_answer_without_them_says_unknown_with_minus_one() -> None:
    # The HTTP layer leaves negative values out of the body (sidecar.http.error_map).
    error = FencedGeneration()
    assert (error.current_generation, error.current_count) == (-1, -1)
    assert error.message == FencedGeneration.default_message


def test_an_invalid_generation_carries_them_too() -> None:
    error = InvalidGeneration(current_generation=2, current_count=6)
    assert (error.current_generation, error.current_count) == (2, 6)
    assert error.message == "the expected generation does not exist"


def test_the_generation_and_count_are_keyword_only() -> None:
    # Positional, 4 would be taken for the message.
    with pytest.raises(TypeError):
        FencedGeneration("fenced", 4, 9)  # type: ignore[call-arg]
