"""Settle detection: is a partition still being written (hot), pausing (settling), or done
(settled)? Decided from the partition's own write cadence (``icecdc.domain.cadence``), as seen in the
commit stream.

A fixed window cannot serve every partition: one written every 5 s has settled after a minute of
silence, one written every 10 min has not. So each partition keeps the times of its recent
writes; its settle window is a multiple of the median gap between them, clamped to configured
bounds. The median, not the mean, so that one long pause (a deploy, a quiet night) does not
stretch the window of an otherwise busy partition.
"""

from __future__ import annotations

import enum

from icecdc.domain.cadence import WriteCadence
from icecdc.runtime.config import SettleConfig

# Hot until the writer is this many usual gaps late: a writer's cadence jitters, and a partition
# must not flap between hot and settling on every late batch.
LATE_FACTOR = 1.5


class Phase(enum.Enum):
    HOT = "hot"
    SETTLING = "settling"
    SETTLED = "settled"


def settle_window(cadence: WriteCadence, settings: SettleConfig) -> float:
    gap = cadence.typical_gap
    window = settings.initial_seconds if gap is None else settings.cadence_multiple * gap
    return min(max(window, settings.min_seconds), settings.max_seconds)


def phase(cadence: WriteCadence, now: float, settings: SettleConfig) -> Phase:
    """A partition with no known write has settled (nothing is writing it)."""
    last = cadence.last_write
    if last is None:
        return Phase.SETTLED
    window = settle_window(cadence, settings)
    quiet = now - last
    if quiet >= window:
        return Phase.SETTLED
    gap = cadence.typical_gap
    expected = window / settings.cadence_multiple if gap is None else gap
    return Phase.HOT if quiet < min(LATE_FACTOR * expected, window) else Phase.SETTLING


def settles_at(cadence: WriteCadence, settings: SettleConfig) -> float | None:
    """When the partition will count as settled if nothing writes it in the meantime."""
    last = cadence.last_write
    return None if last is None else last + settle_window(cadence, settings)


def quiet_windows(cadence: WriteCadence, now: float, settings: SettleConfig) -> float:
    """How many of its settle windows the partition has been quiet for (infinite when no write
    of it is known: nothing is writing it)."""
    last = cadence.last_write
    if last is None:
        return float("inf")
    window = settle_window(cadence, settings)
    return float("inf") if window <= 0 else (now - last) / window
