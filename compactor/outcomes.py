"""What an attempt does to its partition, in one place and free of I/O: an attempt begins
(``begin``), ends in an outcome, and ``resolve`` turns the outcome into the partition's next state
and the outcome its event reports.

- committed, skipped: the partition's last write is answered (nothing is planned again until
  it is written again, except that work done while it was hot leaves the settled partition's
  work to do once it settles), failures are forgotten;
- conflict, failed: retried after ``retry_base_seconds * 2^(n-1)``, jittered between half and
  full, capped at ``retry_max_seconds``; after ``max_attempts`` the partition is given up until
  it is written again, and the outcome becomes ``abandoned``;
- fenced (its lease moved to another replica): no outcome of its own, so nothing to answer and
  nothing to back off from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from icecdc.compactor.settle import settles_at
from icecdc.compactor.tracker import PartitionState
from icecdc.config import CompactorConfig
from icecdc.coordinator.errors import CommitGaveUp, LeaseLost
from icecdc.errors import CommitConflict, CompareAndSetLost
from icecdc.events import CompactionOutcome

Outcome = CompactionOutcome


@dataclass(frozen=True)
class Resolution:
    outcome: CompactionOutcome
    reason: str
    # A committed compaction of a partition that had settled before it started: seconds from
    # settling to this commit (how promptly settled partitions are answered).
    settled_for: float | None = None


def retry_delay(failures: int, settings: CompactorConfig, rng: random.Random) -> float:
    """Exponential backoff with jitter (half to full delay), so replicas do not retry in step."""
    delay = min(settings.retry_max_seconds, settings.retry_base_seconds * 2.0 ** max(0, failures - 1))
    return delay * rng.uniform(0.5, 1.0)


def outcome_of(error: Exception) -> CompactionOutcome:
    """How an attempt that raised ``error`` ended: fenced when the partition's lease moved,
    a conflict when it lost to a concurrent change of its files (or every compare-and-set),
    failed for anything else."""
    if isinstance(error, LeaseLost):
        return Outcome.FENCED
    if isinstance(error, CommitConflict | CompareAndSetLost | CommitGaveUp):
        return Outcome.CONFLICT
    return Outcome.FAILED


def begin(state: PartitionState, hot: bool = False) -> None:
    state.compacting = True
    # The write it answers: one that lands while it runs is not in its starting snapshot.
    state.compacting_after_write = state.cadence.last_write
    state.compacting_hot = hot


def resolve(
    state: PartitionState,
    outcome: CompactionOutcome,
    reason: str,
    *,
    started: float,
    now: float,
    settings: CompactorConfig,
    rng: random.Random,
) -> Resolution:
    state.compacting = False
    if outcome is Outcome.FENCED:
        return Resolution(outcome, reason)
    if outcome in (Outcome.COMMITTED, Outcome.SKIPPED):
        settled = settles_at(state.cadence, settings.settle)
        _answer(state)
        if outcome is not Outcome.COMMITTED:
            return Resolution(outcome, reason)
        state.last_compaction = now
        return Resolution(outcome, reason, now - settled if settled is not None and settled <= started else None)
    if outcome in (Outcome.CONFLICT, Outcome.FAILED):
        state.failures += 1
        if state.failures >= settings.max_attempts:
            _answer(state)
            return Resolution(
                Outcome.ABANDONED, f"{reason} (gave up after {settings.max_attempts} attempts, until the next write)"
            )
        state.retry_at = now + retry_delay(state.failures, settings, rng)
        return Resolution(outcome, reason)
    raise ValueError(f"{outcome.value} is not how an attempt ends")


def _answer(state: PartitionState) -> None:
    state.failures = 0
    state.retry_at = None
    state.answered_write = state.compacting_after_write
    state.answered_hot = state.compacting_hot
