"""Where the sidecar's own work on a partition stands, and what an attempt does to it, in one
place and free of I/O. A partition is in one of four states (``PartitionState``): idle, compacting,
backing off, or answered; an attempt begins (``begin``), ends in an outcome, and ``resolve`` turns
the outcome into the partition's next state and the outcome its event reports. Both return the
new state; the tracker keeps it.

- committed, skipped: the partition's last write is answered (nothing is planned again until
  it is written again, except that work done while it was hot leaves the settled partition's
  work to do once it settles), failures are forgotten. Except a conversion the portability
  target asked for: it answers nothing, so the read budget and the settle rules still judge the
  partition it leaves (converting every batch at once, it would otherwise answer every write
  and the read budget would never be asked while files pile up);
- conflict, failed: retried after ``retry_base_seconds * 2^(n-1)``, jittered between half and
  full, capped at ``retry_max_seconds``; after ``max_attempts`` the partition is given up until
  it is written again, and the outcome becomes ``abandoned``;
- fenced (its lease moved to another replica): no outcome of its own, so nothing to answer and
  nothing to back off from: the partition is back where it was before the attempt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TypeAlias

from icecdc.coordinator.errors import CommitGaveUp, LeaseLost
from icecdc.domain.errors import CommitConflict, CompareAndSetLost
from icecdc.domain.events import CompactionOutcome
from icecdc.runtime.config import CompactorConfig

Outcome = CompactionOutcome


@dataclass(frozen=True)
class Idle:
    """No attempt has answered the partition's writes, and none has failed since the last one that did."""


@dataclass(frozen=True)
class Answered:
    """An attempt answered the write at ``write`` (done, found nothing to do, or given up): no
    new work until the partition is written again. This is what makes the policy stop. ``hot``:
    it was work on a hot partition (what keeps it within its read budget), which leaves the
    settled partition's work (one file per target size, no deletes) to do once it settles.
    ``last_pack``: it was the last pack (``policy.last_pack``); any other answer leaves that to do
    once the partition has been quiet long enough for it."""

    write: float
    hot: bool = False
    last_pack: bool = False

    def holds(self, last_write: float | None, settled: bool, last_pack_due: bool = False) -> bool:
        """Whether the partition, last written at ``last_write``, needs nothing more of its phase
        (``last_pack_due``: it has been quiet long enough for the last pack)."""
        return self.write == last_write and not (settled and self.hot) and not (last_pack_due and not self.last_pack)


@dataclass(frozen=True)
class BackingOff:
    """The last ``failures`` attempts ended in a conflict or a failure: the next waits until
    ``retry_at``. ``answered``: the answer before them, which holds until the next write."""

    failures: int
    retry_at: float
    answered: Answered | None = None


@dataclass(frozen=True)
class Compacting:
    """A job runs on the partition. It answers the write at ``after_write``, the last one known
    when it started: one that lands while it runs is not in its starting snapshot. ``hot``: it
    is work on a hot partition. ``before``: the state it started from (a fenced attempt goes
    back to it)."""

    after_write: float | None
    hot: bool
    before: Idle | Answered | BackingOff
    answers: bool = True  # False: a conversion for the portability target, which answers no write
    last_pack: bool = False  # the last pack of a partition quiet long enough for it

    @property
    def attempt(self) -> int:
        """Which attempt in a row this is (1 unless the last ones failed)."""
        return (self.before.failures if isinstance(self.before, BackingOff) else 0) + 1


PartitionState: TypeAlias = Idle | Compacting | BackingOff | Answered


@dataclass(frozen=True)
class Resolution:
    state: Idle | Answered | BackingOff  # the partition's next state
    outcome: CompactionOutcome
    reason: str
    # A committed compaction of a partition that had settled before it started: seconds from
    # settling to this commit (how promptly settled partitions are answered).
    settled_for: float | None = None


def answered(state: PartitionState, last_write: float | None, settled: bool, last_pack_due: bool = False) -> bool:
    """Whether a partition last written at ``last_write`` has had the work its phase calls for."""
    answer = _standing_answer(state)
    return answer is not None and answer.holds(last_write, settled, last_pack_due)


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


def begin(
    state: PartitionState, last_write: float | None, hot: bool = False, answers: bool = True, last_pack: bool = False
) -> Compacting:
    """An attempt on a partition last written at ``last_write``; never two at once. ``answers``:
    whether it answers that write (not a conversion for the portability target); ``last_pack``:
    it is the last pack."""
    if isinstance(state, Compacting):
        raise ValueError("the partition is already being compacted")
    return Compacting(last_write, hot, state, answers, last_pack)


def resolve(
    state: PartitionState,
    outcome: CompactionOutcome,
    reason: str,
    *,
    settles_at: float | None,
    started: float,
    now: float,
    settings: CompactorConfig,
    rng: random.Random,
) -> Resolution:
    """The end of the attempt ``state`` is in; ``settles_at``: when the partition counts as
    settled (``settle.settles_at``)."""
    if not isinstance(state, Compacting):
        raise ValueError("no attempt is under way to end")
    if outcome is Outcome.FENCED:
        return Resolution(state.before, outcome, reason)
    if outcome is Outcome.COMMITTED:
        settled_for = now - settles_at if settles_at is not None and settles_at <= started else None
        return Resolution(_answer(state), outcome, reason, settled_for)
    if outcome is Outcome.SKIPPED:
        return Resolution(_answer(state), outcome, reason)
    if outcome in (Outcome.CONFLICT, Outcome.FAILED):
        failures = state.attempt
        if failures >= settings.max_attempts:
            return Resolution(
                _answer(state),
                Outcome.ABANDONED,
                f"{reason} (gave up after {settings.max_attempts} attempts, until the next write)",
            )
        retry_at = now + retry_delay(failures, settings, rng)
        return Resolution(BackingOff(failures, retry_at, _standing_answer(state.before)), outcome, reason)
    raise ValueError(f"{outcome.value} is not how an attempt ends")


def _standing_answer(state: PartitionState) -> Answered | None:
    if isinstance(state, BackingOff):
        return state.answered
    return state if isinstance(state, Answered) else None


def _answer(state: Compacting) -> Idle | Answered:
    # A partition with no known write has no write to answer; a conversion for the portability
    # target leaves the answer it found (its failures forgotten).
    if not state.answers:
        return _standing_answer(state.before) or Idle()
    return Idle() if state.after_write is None else Answered(state.after_write, state.hot, state.last_pack)
