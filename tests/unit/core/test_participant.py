"""The participant of a change: fencing a produce by generation, acking a barrier only
once every old send is settled, holding after a reconnect. Linked to a coordinator and
other participants in the simulation of ``test_procedures``."""

from __future__ import annotations

import pytest

from sidecar.core.errors import FencedGeneration, MetadataUnavailable, UnknownGeneration
from sidecar.core.generations import GenerationLog
from sidecar.core.participant import Admission, Participant, SessionState


def test_participant_fencing() -> None:
    participant = Participant(generation=3, undeleted_count=6)
    participant.check_expected(3, 6)
    participant.check_expected(None, None)
    with pytest.raises(FencedGeneration) as fenced:
        participant.check_expected(2, None)
    assert (fenced.value.current_generation, fenced.value.current_count) == (3, 6)
    with pytest.raises(FencedGeneration):
        participant.check_expected(None, 5)
    with pytest.raises(UnknownGeneration):
        participant.check_expected(4, None)
    with pytest.raises(MetadataUnavailable):
        participant.session_changed(SessionState.SUSPENDED).check_expected(3, None)


def test_participant_acks_only_when_every_old_send_is_settled() -> None:
    participant = Participant(generation=0, undeleted_count=2).send_started().send_started()
    participant = participant.barrier_published(1)
    assert participant.admission() is Admission.HOLD
    participant = participant.send_acknowledged(0, 41)
    participant = participant.send_failed(7, maybe_appended=True)
    assert not participant.ready_to_ack()
    participant = participant.uncertain_resolved(7, (1, 9))
    assert participant.ready_to_ack()
    participant, acked = participant.barrier_ack()
    assert acked == {0: 42, 1: 10}
    assert not participant.ready_to_ack()


def test_participant_holds_after_reconnect_until_metadata_is_reloaded() -> None:
    participant = Participant(generation=0, undeleted_count=2)
    participant = participant.session_changed(SessionState.SUSPENDED)
    assert participant.admission() is Admission.HOLD
    participant = participant.session_changed(SessionState.CONNECTED)
    assert participant.admission() is Admission.HOLD
    generation = GenerationLog.start(2).current
    assert participant.metadata_reloaded(generation, None).admission() is Admission.ROUTE
