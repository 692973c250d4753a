"""Retry delays with exponential backoff and jitter, and jittered intervals, as pure
arithmetic.

The caller draws the random number (``fraction`` in [0, 1)) and sleeps; this module
only says how long. "Equal jitter": half of the capped exponential delay is fixed and
half is random, so retries of many sidecars restarted together spread out while none
waits much longer than the cap (a sidecar must be ready soon after its cluster is).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float
    """The delay before the second try (before jitter)."""
    max_s: float
    """No delay exceeds this."""
    factor: float = 2.0

    def delay(self, attempt: int, fraction: float) -> float:
        """Seconds to wait after failed try number ``attempt`` (1 for the first).

        Raises ValueError for an attempt below 1 or a fraction outside [0, 1).
        """
        if attempt < 1:
            raise ValueError(f"attempt must be at least 1, got {attempt}")
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"fraction must be in [0, 1), got {fraction}")
        # Cap the exponent first: factor ** attempt overflows for long outages.
        exponent = min(attempt - 1, 64)
        capped = min(self.max_s, self.initial_s * self.factor**exponent)
        return capped / 2 + capped / 2 * fraction


JITTER_SPREAD = 0.2
"""How far a periodic task's pause strays from its interval, either way (a fraction)."""


def jittered(interval_s: float, fraction: float, spread: float = JITTER_SPREAD) -> float:
    """``interval_s`` moved by up to ``spread`` of itself either way, by ``fraction`` in
    [0, 1) (0.5: unchanged): sidecars started together (a rollout, a node restart) do
    not read ZooKeeper in step round after round.

    Raises ValueError for a fraction outside [0, 1) or a spread outside [0, 1).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    if not 0.0 <= spread < 1.0:
        raise ValueError(f"spread must be in [0, 1), got {spread}")
    return interval_s * (1.0 - spread + 2.0 * spread * fraction)
