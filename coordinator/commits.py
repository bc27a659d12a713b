"""The commit gate: every compaction commit goes through it.

It waits for the writer's quiet window (``quiet``), checks the lease (``leases``), commits, and
when the commit loses the catalog's compare-and-set even after Iceberg's own quick retries, backs
off with jitter and tries again in the next quiet window, up to ``commit_attempts`` times; then
it gives the compaction up (its files are deleted by the caller) rather than keep racing the
writer. A validation failure (the files changed under the compaction) or a lost lease is never
retried: the compaction's plan is stale and must be made again from the new snapshot.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from icecdc.coordinator import metrics
from icecdc.coordinator.errors import CommitGaveUp
from icecdc.coordinator.quiet import quiet_delay
from icecdc.domain.cadence import WriteCadence
from icecdc.domain.errors import CommitConflict, CompareAndSetLost
from icecdc.jvm.tables import CommittedSnapshot
from icecdc.runtime import failpoints
from icecdc.runtime.config import CoordinatorConfig

log = logging.getLogger(__name__)

# A first guess at a compaction commit's duration until this process has timed one.
INITIAL_COMMIT_SECONDS = 0.5


class Attempt(Protocol):
    """One try at a commit, building a fresh Iceberg update. ``checked_through``: the newest
    snapshot up to which the check before the attempt has examined the writer's commits itself
    (None: none did), so that Iceberg's validation need only cover the commits after it."""

    def __call__(self, checked_through: int | None = None) -> CommittedSnapshot: ...


@dataclass
class CommitStats:
    attempts: int = 0
    conflicts: int = 0
    retries: int = 0
    gave_up: int = 0
    # The latest waits for a quiet window (bounded: the sidecar runs for months; the histogram
    # metric keeps the whole distribution).
    quiet_wait_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=1000))


class CommitGate:
    def __init__(
        self,
        settings: CoordinatorConfig,
        cadence: Callable[[str], WriteCadence],
        poll: Callable[[float], object],
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._settings = settings
        self._cadence = cadence
        self._poll = poll  # reads commit events for up to the given seconds (the writer's cadence)
        self._clock = clock
        self._sleep = sleep
        self._commit_seconds: dict[str, float] = {}
        self.stats = CommitStats()

    def wait_for_quiet(self, table: str, commit_by: float | None = None) -> float:
        """Wait (reading commit events meanwhile) until the table's writer is quiet, or for at
        most ``max_quiet_wait_seconds``; returns the seconds waited. ``commit_by``: when the
        commit must have landed (the portability target's deadline for a conversion): a quiet
        window it could not wait for and still commit in time is not waited for at all. A commit
        mid-gap may race the writer's next commit (the loser of the compare-and-set retries);
        an equality delete past the target fails every reader that cannot apply it."""
        if not self._settings.quiet_windows:
            return 0.0
        started = self._clock()
        deadline = started + self._settings.max_quiet_wait_seconds
        expected = self._commit_seconds.get(table, INITIAL_COMMIT_SECONDS)
        while True:
            # Catch up first: a long compaction leaves the writer's latest commits unread, and a
            # stale cadence would look like a writer that has stopped.
            self._poll(0.0)
            now = self._clock()
            delay = quiet_delay(self._cadence(table), now, expected)
            if delay <= 0 or now >= deadline or (commit_by is not None and now + delay + expected > commit_by):
                break
            self._poll(min(delay, deadline - now))
        waited = self._clock() - started
        self.stats.quiet_wait_seconds.append(waited)
        metrics.QUIET_WAIT.labels(table).observe(waited)
        return waited

    def commit(
        self,
        table: str,
        attempt: Attempt,
        before_attempt: Callable[[], int | None] = lambda: None,
        commit_by: float | None = None,
    ) -> CommittedSnapshot:
        """Commit through ``attempt`` (which builds a fresh update each time: a failed Iceberg
        update cannot be committed again). ``before_attempt`` checks the leases and the writer,
        and returns the snapshot it checked the writer's commits through, which ``attempt``
        gets; ``commit_by`` as ``wait_for_quiet`` has it."""

        def one_attempt() -> CommittedSnapshot:
            self.wait_for_quiet(table, commit_by)
            try:
                checked_through = before_attempt()
            except CommitConflict:  # the writer wrote the job's partitions again (``WriterWroteThere``)
                self._count(table, attempts=1, conflicts=1, kind="writer")
                raise
            failpoints.hit("compactor-after-lease-check")
            started = self._clock()
            try:
                committed = attempt(checked_through)
            except CompareAndSetLost:
                self._count(table, attempts=1, conflicts=1, kind="cas")
                raise
            except CommitConflict:
                self._count(table, attempts=1, conflicts=1, kind="validation")
                raise
            except Exception:
                self._count(table, attempts=1, conflicts=0, kind="")
                raise
            seconds = self._clock() - started
            previous = self._commit_seconds.get(table)
            self._commit_seconds[table] = seconds if previous is None else 0.7 * previous + 0.3 * seconds
            # Each commit that landed meanwhile made Iceberg retry ours once.
            self._count(table, attempts=1 + committed.interleaved, conflicts=committed.interleaved, kind="cas")
            return committed

        retrying = Retrying(
            stop=stop_after_attempt(self._settings.commit_attempts),
            wait=wait_random_exponential(
                multiplier=self._settings.commit_backoff_seconds, max=self._settings.commit_backoff_max_seconds
            ),
            retry=retry_if_exception_type(CompareAndSetLost),
            sleep=self._sleep,
            before_sleep=lambda state: self._retrying(table, state.attempt_number),
        )
        try:
            return retrying(one_attempt)
        except RetryError as exc:
            self.stats.gave_up += 1
            metrics.COMMIT_GAVE_UP.labels(table).inc()
            raise CommitGaveUp(
                f"lost the catalog's compare-and-set {self._settings.commit_attempts} times; "
                "giving the compaction up rather than racing the writer"
            ) from exc.last_attempt.exception()

    def _retrying(self, table: str, attempt_number: int) -> None:
        self.stats.retries += 1
        metrics.COMMIT_RETRIES.labels(table).inc()
        log.info(
            "compaction commit on %s lost the catalog's compare-and-set (attempt %d); retrying after a backoff",
            table,
            attempt_number,
            extra={"table": table},
        )

    def _count(self, table: str, attempts: int, conflicts: int, kind: str) -> None:
        self.stats.attempts += attempts
        self.stats.conflicts += conflicts
        metrics.COMMIT_ATTEMPTS.labels(table).inc(attempts)
        if conflicts:
            metrics.COMMIT_CONFLICTS.labels(table, kind).inc(conflicts)

    def lease_lost(self, table: str) -> None:
        self.stats.conflicts += 1
        metrics.COMMIT_CONFLICTS.labels(table, "lease").inc()
