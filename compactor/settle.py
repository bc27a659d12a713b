"""Settle detection: is a partition still being written (hot), pausing (settling), or done
(settled)? Decided from the partition's own write cadence, as seen in the commit stream.

A fixed window cannot serve every partition: one written every 5 s has settled after a minute of
silence, one written every 10 min has not. So each partition keeps the times of its recent
writes; its settle window is a multiple of the median gap between them, clamped to configured
bounds. The median, not the mean, so that one long pause (a deploy, a quiet night) does not
stretch the window of an otherwise busy partition.
"""

from __future__ import annotations

import enum
import statistics
from collections import deque
from dataclasses import dataclass, field

from icecdc.config import SettleConfig

RECENT_WRITES = 16
# Hot until the writer is this many usual gaps late: a writer's cadence jitters, and a partition
# must not flap between hot and settling on every late batch.
LATE_FACTOR = 1.5


class Phase(enum.Enum):
    HOT = "hot"
    SETTLING = "settling"
    SETTLED = "settled"


@dataclass
class WriteCadence:
    """The recent write times (epoch seconds) of one partition."""

    times: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_WRITES))

    def record(self, at: float) -> None:
        # Events can arrive out of order (several ingesters, a replayed topic); keep them sorted
        # and ignore a time already known (the same commit seen twice).
        if at in self.times:
            return
        if not self.times or at > self.times[-1]:
            self.times.append(at)
            return
        ordered = sorted([*self.times, at])[-RECENT_WRITES:]
        self.times.clear()
        self.times.extend(ordered)

    @property
    def last_write(self) -> float | None:
        return self.times[-1] if self.times else None

    @property
    def typical_gap(self) -> float | None:
        if len(self.times) < 2:
            return None
        gaps = [b - a for a, b in zip(self.times, list(self.times)[1:])]
        return statistics.median(gaps)


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
