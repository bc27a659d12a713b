"""What the sidecar does next, decided from plain data (as Flink's ``TriggerManager`` decides
maintenance triggers in one place): the loop asks, does it, and asks again.

One piece of work per turn, so that the group protocol is served between two (a rebalance waits
for whatever this replica is doing). Due maintenance goes before compactions, since a busy
replica always has a partition to compact; a conversion the portability target asks for goes
ahead of it once, so that each waits at most one run of the other. Then the best-ranked partition
on a table no maintenance run is touching, with the small ones that share its job
(``job_partitions``); conversions coming due go ahead of a step that would hold them past their
deadline (``convert_first``). Free of I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from icecdc.compactor.policy import FIXED_COST_BYTES, Candidate, Work
from icecdc.domain.events import MaintenanceKind


@dataclass(frozen=True)
class Maintain:
    table: str
    kind: MaintenanceKind


@dataclass(frozen=True)
class Compact:
    """One compaction job: the best candidate, and the partitions that share its job."""

    candidates: tuple[Candidate, ...]


Step = Maintain | Compact | None


def owned_candidates(
    candidates: Sequence[Candidate], owns: Callable[[str, str], bool], maintenance_running: Callable[[str], bool]
) -> list[Candidate]:
    """The candidates (ranked) in partitions this replica holds, on tables no maintenance run is
    touching: a maintenance run stops new compactions of its table on every replica."""
    return [c for c in candidates if owns(c.table, c.partition_path) and not maintenance_running(c.table)]


# Work one job may do for several partitions: what a settled partition needs. Conversions (a
# hot partition's, the global deletes') commit as a ``RowDelta`` of their own.
JOB_WORK = frozenset({Work.MINOR, Work.DELETE_MERGE, Work.REMOVE_DANGLING_DELETES})


def job_partitions(candidates: Sequence[Candidate], partitions_per_job: int, job_bytes: int) -> tuple[Candidate, ...]:
    """The best candidate, with the next best ones that share its Spark job and its commit.

    A CDC table settles many small partitions (yesterday's days, a tenant's buckets), each worth
    less than the fixed cost of a job of its own: a listing, a Spark job, a quiet window and a
    commit. So a settled partition whose data fits in ``job_bytes`` (the target file size) takes
    along the next ranked settled ones of its table, up to ``partitions_per_job``, as long as all
    of them together still fit: one task then writes each partition's one file. The portability
    target's conversions due together share one job (``is_due_conversion``). A partition still
    being written for its read budget, or the global deletes, get a job of their own."""

    best = candidates[0]
    converting = is_due_conversion(best)

    def joins(c: Candidate) -> bool:
        if converting:
            return is_due_conversion(c)
        return not c.hot and c.work in JOB_WORK and c.data_bytes <= job_bytes

    job, total = [best], best.data_bytes
    if partitions_per_job == 1 or not joins(best):
        return (best,)
    for c in candidates[1:]:
        if len(job) == partitions_per_job:
            break
        if c.table == best.table and joins(c) and (converting or total + c.data_bytes <= job_bytes):
            job.append(c)
            total += c.data_bytes
    return tuple(job)


def rewrites(c: Candidate) -> bool:
    """Whether the candidate's job may rewrite data (a merge, a pack, or the read budget's work,
    which may pack): neither the portability target's conversions nor a global resolution does."""
    return not is_due_conversion(c) and c.work is not Work.RESOLVE_GLOBAL_DELETES


def is_due_conversion(c: Candidate) -> bool:
    """A conversion the portability target asks for now. Those of one table share a job and its
    one ``RowDelta``: a batch that wrote many partitions makes them all due together, and one at a
    time (a listing, the key reads and a commit each) the last would wait past the target for the
    others (docs/BENCHMARKS.md, row "Portability age"). They rewrite no data, so the job's byte
    bound does not apply."""
    return c.due_by is not None and c.work is Work.CONVERT


def next_step(
    maintenance_due: Sequence[tuple[str, MaintenanceKind]],
    candidates: Sequence[Candidate],
    partitions_per_job: int = 1,
    job_bytes: int = 0,
    maintenance_deferred: bool = False,
) -> Step:
    """A conversion the portability target asks for, unless the last turn already put one ahead
    of due maintenance (``maintenance_deferred``); then maintenance; then the best candidate's
    job; else nothing to do. Ranked candidates hold the target's conversions first."""
    urgent = bool(candidates) and candidates[0].due_by is not None
    if urgent and not (maintenance_due and maintenance_deferred):
        return Compact(job_partitions(candidates, partitions_per_job, job_bytes))
    if maintenance_due:
        return Maintain(*maintenance_due[0])
    if candidates:
        return Compact(job_partitions(candidates, partitions_per_job, job_bytes))
    return None


# What a rewrite is assumed to get through, in bytes of its estimated cost a second, until this
# replica has timed one of its own (``RewritePace`` then uses what it measures): a third of what
# minor compactions reach with nothing beside them (docs/BENCHMARKS.md, row "Rewrite
# throughput"), since beside a writer and readers they go slower, and guessing a rewrite too long
# only puts a conversion early.
DEFAULT_REWRITE_BYTES_PER_SECOND = 16 * 1024 * 1024
# The weight of the newest job in the pace (an exponentially weighted mean).
PACE_WEIGHT = 0.3


@dataclass
class RewritePace:
    """How fast this replica's rewrites go, in bytes of their estimated cost (``Candidate.cost``:
    the bytes rewritten plus a fixed cost) a second: the loop does one job at a time, so this
    tells ``convert_first`` how long a rewrite about to start would hold the conversions behind
    it (``holding_seconds``)."""

    bytes_per_second: float = DEFAULT_REWRITE_BYTES_PER_SECOND
    measured: bool = False

    def observe(self, bytes_rewritten: int, partitions: int, seconds: float) -> None:
        """A job of ``partitions`` that rewrote ``bytes_rewritten`` in ``seconds``, start to end."""
        if seconds <= 0:
            return
        pace = (bytes_rewritten + partitions * FIXED_COST_BYTES) / seconds
        weight = PACE_WEIGHT if self.measured else 1.0
        self.bytes_per_second += weight * (pace - self.bytes_per_second)
        self.measured = True

    def seconds_for(self, job: Sequence[Candidate]) -> float:
        return sum(c.cost for c in job) / self.bytes_per_second


# How long a maintenance run never timed on a table is assumed to take: longer than a large
# table's orphan-file listing beside a writer (docs/BENCHMARKS.md, row "Portability age"). Finite,
# so that only conversions coming due within it go first (a target of days converts nothing early).
UNTIMED_MAINTENANCE_SECONDS = 60.0


def holding_seconds(step: Step, pace: RewritePace, maintenance_seconds: Mapping[tuple[str, MaintenanceKind], float]) -> float:
    """How long ``step`` is expected to hold the loop: a compaction, its estimated cost at this
    replica's pace; a maintenance run that commits, its last run on the table
    (``maintenance_seconds``), or ``UNTIMED_MAINTENANCE_SECONDS`` if it has none; one that does
    not, nothing (it runs beside the loop: ``MaintenanceRunner.start``)."""
    if isinstance(step, Compact):
        return pace.seconds_for(step.candidates)
    if isinstance(step, Maintain) and step.kind.commits:
        return maintenance_seconds.get((step.table, step.kind), UNTIMED_MAINTENANCE_SECONDS)
    return 0.0


def convert_first(
    step: Step,
    coming: Sequence[Candidate],
    step_seconds: float,
    now: float,
    conversion_margin: float,
    partitions_per_job: int = 1,
    converted_ahead: bool = False,
) -> Step:
    """The portability target's coming conversions (``coming``: not due yet, ranked, their
    deadlines in ``due_by``) ahead of a step that would still hold the loop when the first of
    them comes due, that is ``conversion_margin`` (the share of the target left for the
    conversion itself) before its deadline; ``step_seconds``: how long the step is expected to
    take (``holding_seconds``). The loop does one job at a time, so a merge, a pack or a
    maintenance run that starts just before a batch's equality deletes come due holds them for
    its whole length (a settled partition's merge beside a hot one, a hot partition past its
    ceiling, an orphan-file listing on a large table). Converted first, they wait only if they
    land while the step runs. Once only (``converted_ahead``: the last step was such a conversion): a writer
    whose batches keep landing during the conversions would otherwise hold the step off for
    ever. Conversions and global resolutions rewrite nothing and are left as they are."""
    if converted_ahead or step is None or not coming:
        return step
    if isinstance(step, Compact) and not rewrites(step.candidates[0]):
        return step
    first = coming[0]
    assert first.due_by is not None
    if now + step_seconds <= first.due_by - conversion_margin:
        return step
    what = "rewrite" if isinstance(step, Compact) else step.kind.value
    why = f"; ahead of a {what} expected to take {step_seconds:.1f}s"
    ahead = [replace(c, reason=c.reason + why) for c in coming]
    return Compact(job_partitions(ahead, partitions_per_job, 0))


# With nothing to do, the loop waits at most this long for events before it looks again.
IDLE_POLL_SECONDS = 1.0


def poll_timeout(has_candidates: bool, next_due: float | None, now: float) -> float:
    """How long the next turn may wait for events: not at all with work to do; else until the
    portability target next asks for a conversion (``tracker.next_due``), at most
    ``IDLE_POLL_SECONDS``. A commit event ends the wait sooner. A due time already past is work
    this replica cannot do now (another replica's partition, a maintenance run on the table): it
    does not shorten the wait."""
    if has_candidates:
        return 0.0
    if next_due is None or next_due <= now:
        return IDLE_POLL_SECONDS
    return min(IDLE_POLL_SECONDS, next_due - now)


def idle(*, joined: bool, quiet_seconds: float, until_idle: float, has_candidates: bool, waiting: bool) -> bool:
    """Whether ``--until-idle`` may stop the sidecar: in its group, quiet (no commit event and no
    wait on the catalog, ``icecdc.domain.idle``) for ``until_idle`` seconds, nothing due and nothing
    waiting to become due (hot or backing off)."""
    return joined and quiet_seconds >= until_idle and not has_candidates and not waiting
