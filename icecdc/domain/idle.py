"""When ``--until-idle SECONDS`` may stop a command: once it has been quiet that long.

Quiet means no activity (the ingester: records read; the sidecar: commit events) and no wait on
the catalog. Time blocked on an unavailable catalog is not quiet: the writers behind the sidecar
cannot commit either, so their commit events stop for as long as the outage lasts. The window
starts afresh when an outage ends, since a writer that was blocked has a backlog to commit.
The command's ``CatalogRetry`` says what it has met (``CatalogWaits``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogWaits:
    """What a command's catalog calls have met so far."""

    outages: int = 0  # outages met (each one counted when it began)
    waiting: bool = False  # a call is waiting for the catalog to answer right now


class IdleClock:
    """How long a command has been quiet, from its activity and its waits on the catalog, as
    plain times (any one clock: the sidecar's epoch seconds, the ingester's monotonic ones)."""

    def __init__(self, now: float, waits: CatalogWaits | None = None) -> None:
        self._quiet_since = now
        self._waits = waits or CatalogWaits()

    def activity(self, at: float) -> None:
        """Something happened at ``at``: the quiet starts after it (earlier news changes nothing)."""
        self._quiet_since = max(self._quiet_since, at)

    def catalog(self, waits: CatalogWaits, now: float) -> None:
        """What the catalog calls have met, as seen at ``now``. A wait going on, one seen before
        and over by now, or an outage met since the last look holds the quiet back to ``now``: the
        time blocked never counts, and the window starts afresh after it."""
        if waits.waiting or self._waits.waiting or waits.outages != self._waits.outages:
            self.activity(now)
        self._waits = waits

    def quiet_seconds(self, now: float) -> float:
        if self._waits.waiting:
            return 0.0
        return max(0.0, now - self._quiet_since)

    def idle(self, now: float, until_idle: float) -> bool:
        return self.quiet_seconds(now) >= until_idle
