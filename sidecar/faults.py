"""Faults the crash tests inject into a running sidecar, behind one object.

Production builds leave it empty (``FaultHooks()``, every hook a no-op): the settings
that arm it (``faults.*``) are empty by default, and the components ask the hooks, not
the settings, so no fault code path hides in them. A test arms a subprocess sidecar's
hooks through those settings and watches it die or stop where a real failure would
hit hardest.
"""

from __future__ import annotations

import logging
import os
import signal

from sidecar.core.procedures import Phase

_log = logging.getLogger(__name__)


class FaultHooks:
    def __init__(
        self,
        *,
        kill_after_phase: Phase | None = None,
        withhold_barrier_acks: bool = False,
        stop_before_commit: int = 0,
        stop_before_send: int = 0,
        skip_fence: bool = False,
        stop_before_compaction_write: bool = False,
        ungated_delivery: bool = False,
    ) -> None:
        self.kill_after_phase = kill_after_phase
        """SIGKILL this process right after it journals a change entering this phase."""
        self.withhold_barrier_acks = withhold_barrier_acks
        """Never ack a barrier, as a sidecar whose sends never settle: changes time out."""
        self.stop_before_commit = stop_before_commit
        """SIGSTOP this process before committing its Nth transaction (0: never), once."""
        self.stop_before_send = stop_before_send
        """SIGSTOP this process before sending its Nth transaction's records (0: never),
        once: they are routed and stamped, nothing of them is sent."""
        self.skip_fence = skip_fence
        """Changes coordinated here leave the ids of sidecars whose session is gone
        unfenced: a zombie's writes go through (and land across a barrier)."""
        self._sends = 0
        self.stop_before_compaction_write = stop_before_compaction_write
        """SIGSTOP this process once, after a compaction read what it folds and before its
        first write: a compactor paused (or, killed then, dead) holding the topic's lock."""
        self.ungated_delivery = ungated_delivery
        """Consumers release records without the gate or the key hand-off, as for a topic
        without ordered delivery: per-key order breaks across changes."""
        self._stopped = False
        self._compaction_stopped = False

    def phase_journaled(self, phase: Phase) -> None:
        if phase is self.kill_after_phase:
            # Die as abruptly as a killed pod: no cleanup, no flush.
            os.kill(os.getpid(), signal.SIGKILL)

    def before_commit(self, transactions_committed: int, transactional_ids: object) -> None:
        """Called before a transaction's commit is sent, with the number its writer
        committed so far: the records are appended, the commit not sent."""
        if self._stopped or transactions_committed + 1 != self.stop_before_commit:
            return
        self._stopped = True  # once: the writer that replaces this one commits on
        _log.warning("fault injection: stopping before the commit of %s", transactional_ids)
        os.kill(os.getpid(), signal.SIGSTOP)

    def before_send(self, transactional_ids: object) -> None:
        """Called before a transaction is begun for records already routed and stamped."""
        self._sends += 1
        if self._sends != self.stop_before_send:
            return
        _log.warning("fault injection: stopping before the records of %s", transactional_ids)
        os.kill(os.getpid(), signal.SIGSTOP)

    def before_compaction_write(self, topic: str) -> None:
        """Called under the topic's lock, the fold decided, before its first multi-op."""
        if not self.stop_before_compaction_write or self._compaction_stopped:
            return
        self._compaction_stopped = True
        _log.warning("fault injection: stopping before writing the compaction of %s", topic)
        os.kill(os.getpid(), signal.SIGSTOP)
