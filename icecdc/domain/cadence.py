"""When something was written: the recent commit times of one table or one partition, as the
commit events report them. The settle detector reads a partition's cadence to tell hot from
settled; the coordinator reads a table's to find the writer's quiet windows."""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from dataclasses import dataclass, field

RECENT_WRITES = 16


@dataclass
class WriteCadence:
    """The recent write times (epoch seconds) of one table or partition, oldest first."""

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
        """The median gap between recent writes: one long pause (a deploy, a quiet night) does
        not stretch the gap of an otherwise busy writer."""
        if len(self.times) < 2:
            return None
        return statistics.median(b - a for a, b in itertools.pairwise(self.times))
