"""``sidecar.core.backoff``: the pauses between a starting sidecar's tries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.backoff import JITTER_SPREAD, Backoff, jittered

BACKOFF = Backoff(initial_s=0.2, max_s=2.0)


def test_the_pause_doubles_until_the_cap() -> None:
    # The fixed half of each pause (fraction 0): 0.1, 0.2, 0.4, 0.8, then the cap's half.
    assert [BACKOFF.delay(attempt, 0.0) for attempt in range(1, 7)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )


@given(attempt=st.integers(1, 10_000), fraction=st.floats(0.0, 1.0, exclude_max=True))
def test_every_pause_is_between_half_the_capped_delay_and_the_cap(
    attempt: int, fraction: float
) -> None:
    capped = min(BACKOFF.max_s, BACKOFF.initial_s * 2.0 ** min(attempt - 1, 64))
    delay = BACKOFF.delay(attempt, fraction)
    # At most the cap: a fraction just below 1 may round up to it.
    assert capped / 2 <= delay <= capped
    assert delay <= BACKOFF.max_s


def test_the_jitter_spreads_sidecars_that_fail_together() -> None:
    assert BACKOFF.delay(5, 0.0) < BACKOFF.delay(5, 0.5) < BACKOFF.delay(5, 0.99)


@pytest.mark.parametrize(("attempt", "fraction"), [(0, 0.5), (1, 1.0), (1, -0.1)])
def test_out_of_range_arguments_are_refused(attempt: int, fraction: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        BACKOFF.delay(attempt, fraction)


@given(st.floats(0.0, 1e6), st.floats(0.0, 1.0, exclude_max=True))
def test_a_jittered_interval_strays_at_most_the_spread_either_way(
    interval_s: float, fraction: float
) -> None:
    pause = jittered(interval_s, fraction)
    assert interval_s * (1 - JITTER_SPREAD) <= pause <= interval_s * (1 + JITTER_SPREAD)


def test_jittered_intervals_spread_sidecars_started_together() -> None:
    assert jittered(10.0, 0.5) == 10.0
    assert jittered(10.0, 0.0) == pytest.approx(8.0)
    assert jittered(10.0, 0.999) == pytest.approx(12.0, abs=0.01)
    with pytest.raises(ValueError, match="fraction"):
        jittered(10.0, 1.0)
    with pytest.raises(ValueError, match="spread"):
        jittered(10.0, 0.5, spread=1.0)
