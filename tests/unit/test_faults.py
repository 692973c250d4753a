"""FaultHooks: empty by default; armed, each fault fires where and as often as asked."""

from __future__ import annotations

import os
import signal

import pytest

from sidecar.core.procedures import Phase
from sidecar.faults import FaultHooks


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sent: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(sig))
    return sent


def test_empty_hooks_do_nothing(signals: list[int]) -> None:
    hooks = FaultHooks()
    for phase in Phase:
        hooks.phase_journaled(phase)
    for committed in range(5):
        hooks.before_commit(committed, ("t",))
        hooks.before_send(("t",))
    hooks.before_compaction_write("t")
    assert signals == []
    assert not hooks.withhold_barrier_acks
    assert not hooks.skip_fence
    assert not hooks.ungated_delivery


def test_a_kill_after_a_phase_fires_at_that_phase_only(signals: list[int]) -> None:
    hooks = FaultHooks(kill_after_phase=Phase.FENCING)
    for phase in Phase:
        hooks.phase_journaled(phase)
    assert signals == [signal.SIGKILL]


def test_a_stop_before_the_nth_commit_fires_once(signals: list[int]) -> None:
    hooks = FaultHooks(stop_before_commit=2)
    hooks.before_commit(0, ("t",))
    assert signals == []
    hooks.before_commit(1, ("t",))
    assert signals == [signal.SIGSTOP]
    hooks.before_commit(1, ("t~1",))  # the writer that replaced the stopped one
    assert signals == [signal.SIGSTOP]


def test_a_stop_before_the_nth_send_fires_once(signals: list[int]) -> None:
    hooks = FaultHooks(stop_before_send=2)
    hooks.before_send(("t",))
    assert signals == []
    hooks.before_send(("t",))
    assert signals == [signal.SIGSTOP]
    hooks.before_send(("t",))
    assert signals == [signal.SIGSTOP]


def test_a_stop_before_a_compaction_write_fires_once(signals: list[int]) -> None:
    hooks = FaultHooks(stop_before_compaction_write=True)
    hooks.before_compaction_write("t")
    hooks.before_compaction_write("t")
    assert signals == [signal.SIGSTOP]
