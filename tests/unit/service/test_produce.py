"""How the produce service turns the writer's outcomes into answers."""

from __future__ import annotations

from sidecar.adapters.kafka import SendFailed, SentRecord
from sidecar.adapters.transactions import Outcome
from sidecar.core.errors import KafkaAuthenticationFailed
from sidecar.core.produce import RecordFailed
from sidecar.service.produce import _identity_refusal, _result

MESSAGE = "kafka.security.sasl_username / kafka.security.sasl_password: Kafka refused ..."


def _refused() -> SendFailed:
    return SendFailed(MESSAGE, maybe_appended=False, retriable=False, identity_refused=True)


def test_a_request_whose_records_were_all_refused_fails_whole_as_refused() -> None:
    refusal = _identity_refusal([_refused(), _refused()])
    assert isinstance(refusal, KafkaAuthenticationFailed)
    assert (refusal.http_status, refusal.error_code) == (503, 50370)
    assert refusal.message == MESSAGE


def test_a_request_with_another_outcome_is_answered_per_record() -> None:
    outcomes: list[Outcome] = [_refused(), SentRecord(0, 7)]
    assert _identity_refusal(outcomes) is None
    assert _identity_refusal([SendFailed("timeout", maybe_appended=True)]) is None
    assert _identity_refusal([]) is None


def test_a_refused_record_is_answered_with_the_identity_error_not_unavailable() -> None:
    answer = _result(_refused())
    assert isinstance(answer, RecordFailed)
    assert answer.error_code == 50370
    assert _result(SendFailed("timeout", maybe_appended=True)) == RecordFailed(50002, "timeout")
