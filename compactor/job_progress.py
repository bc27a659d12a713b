"""One compaction job as it goes on: its partitions, each with its plan at the starting snapshot
and its counts, and the job's decisions that need no I/O (the commit's deadline, how a failure
ends the job, which partitions leave the key index). The compaction runner does the I/O; this
module must not import Spark, Kafka, Java or the catalog.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeAlias

from icecdc.compactor import outcomes
from icecdc.compactor.outcomes import Outcome
from icecdc.compactor.plans import CONVERSIONS, PartitionFiles, RewritePlan, plan_for
from icecdc.compactor.policy import Candidate, Work
from icecdc.compactor.tracker import TrackedPartition
from icecdc.domain.events import CompactionCounts
from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.runtime.config import CompactorConfig

# How a failed job ended: the outcome of all its partitions with work, and the reason they report.
Failure: TypeAlias = tuple[Outcome, str]


@dataclass(frozen=True)
class JobPartition:
    """One partition of a compaction job as the job goes on: why it was chosen, the lease slot
    it is in, which attempt in a row this is, then its plan at the starting snapshot, what the
    job did to it, and how it ended (``started`` until then)."""

    candidate: Candidate
    partition: TrackedPartition
    slot: int
    attempt: int
    reason: str
    plan: RewritePlan | None = None  # None until the job has listed and planned it
    counts: CompactionCounts | None = None  # from the starting snapshot on, if it has work
    outcome: Outcome = Outcome.STARTED

    @property
    def has_work(self) -> bool:
        return self.plan is not None and not self.plan.empty

    @property
    def kind(self) -> Work:
        """The plan's work once planned (it may find less to do), else what it was chosen for."""
        return self.plan.work if self.plan is not None and self.has_work else self.candidate.work

    def ending(self, failure: Failure | None) -> Failure:
        """How its attempt ended, when the job ended in ``failure`` (None: it did not fail):
        the job commits once, so every partition it had work for shares its end; one with
        nothing to do at the starting snapshot was skipped whatever became of the others."""
        if self.plan is not None and self.plan.empty:
            return Outcome.SKIPPED, f"{self.reason}; nothing to rewrite at the current snapshot"
        return failure or (Outcome.COMMITTED, self.reason)

    def leaves_key_index(self, outcome: Outcome) -> bool:
        """Whether the job rewrote this settled partition's data: its conversions are done, and
        were it written again, its next conversion rebuilds its keys."""
        rewrote = self.plan is not None and bool(self.plan.rewrite) and self.plan.work not in CONVERSIONS
        # The key index holds current-spec partitions only (conversions), never an older spec's.
        held = not (self.partition.is_global or self.partition.is_older_spec)
        return outcome is Outcome.COMMITTED and rewrote and not self.candidate.hot and held


@dataclass
class JobPhases:
    """Where a job's time went, for its log line: listing the partitions, the work itself (rewrite
    or conversion), the commit through the gate (its wait for the writer's quiet window included)
    and the re-read of the table after it."""

    listing: float = 0.0
    work: float = 0.0
    commit: float = 0.0
    reread: float = 0.0

    def __str__(self) -> str:
        return f"list {self.listing:.1f}s, work {self.work:.1f}s, commit {self.commit:.1f}s, re-read {self.reread:.1f}s"


@dataclass
class JobUnderWay:
    """One job of partitions of one table, from its start to its end. Each step replaces
    ``parts``, so a job that fails part way ends each partition by what it knew by then."""

    table: str
    layout: TableLayout
    parts: list[JobPartition]
    started: float
    phases: JobPhases = field(default_factory=JobPhases)

    @property
    def slots(self) -> list[int]:
        """The lease slots to confirm before the job starts and before each commit attempt."""
        return sorted({part.slot for part in self.parts})

    @property
    def what(self) -> str:
        """The job in the words of its lease checks and its failure log."""
        paths = ", ".join(part.candidate.partition_path or "(unpartitioned)" for part in self.parts)
        return f"compacting {self.table} {paths}"

    @property
    def commit_by(self) -> float | None:
        """The portability target's nearest deadline for the conversions it asked for: the
        commit does not wait for the writer's quiet window past it."""
        return min((part.candidate.due_by for part in self.parts if part.candidate.due_by is not None), default=None)

    @property
    def keys(self) -> list[PartitionKey] | None:
        """The partitions the job lists; None: the table's global deletes."""
        if self.parts[0].partition.is_global:
            return None
        return [partition_key(part.partition, self.layout) for part in self.parts]

    @property
    def has_work(self) -> bool:
        return any(part.has_work for part in self.parts)

    def plan(self, listed: Sequence[PartitionFiles] | None, settings: CompactorConfig) -> list[RewritePlan]:
        """Plans each partition at the starting snapshot from its ``listed`` files, in order;
        None: an empty table, with nothing to rewrite anywhere."""
        if listed is None:
            plans = [RewritePlan(part.candidate.work) for part in self.parts]
        else:
            plans = [_plan(part.candidate, files, settings, self.layout) for part, files in zip(self.parts, listed, strict=True)]
        self.parts = [replace(part, plan=plan) for part, plan in zip(self.parts, plans, strict=True)]
        return plans

    @property
    def starting_sequence_number(self) -> int | None:
        """The sequence number of the snapshot the job started from (None: not announced yet)."""
        starts = (p.counts.starting_sequence_number for p in self.parts if p.counts is not None)
        return next((seq for seq in starts if seq is not None), None)

    def start_from(self, snapshot_id: int, sequence_number: int) -> None:
        """Counts each partition with work from the job's starting snapshot."""
        at_start = CompactionCounts(starting_snapshot_id=snapshot_id, starting_sequence_number=sequence_number)
        self.parts = [replace(part, counts=at_start) if part.has_work else part for part in self.parts]

    def finish_with(self, counts: Sequence[CompactionCounts]) -> None:
        """Takes what the work did to each partition with work (``counts``: one a partition, in order)."""
        self.parts = [
            replace(part, counts=done) if part.has_work else part for part, done in zip(self.parts, counts, strict=True)
        ]


def failure_of(error: Exception) -> Failure:
    """How a job that raised ``error`` ends (``outcomes.outcome_of``); an unexpected failure
    names the error's type, since its message alone may not say what went wrong."""
    outcome = outcomes.outcome_of(error)
    return outcome, f"{type(error).__name__}: {error}" if outcome is Outcome.FAILED else str(error)


def partition_key(partition: TrackedPartition, layout: TableLayout) -> PartitionKey:
    """The partition's values, in the order of the table's partition fields."""
    return tuple(partition.partition.get(t.name) for t in layout.partition)


def _plan(candidate: Candidate, files: PartitionFiles, settings: CompactorConfig, layout: TableLayout) -> RewritePlan:
    return plan_for(
        candidate.work,
        files,
        settings,
        hot=candidate.hot,
        portable=candidate.due_by is not None,
        deletion_vectors=layout.format_version >= 3,
        last_pack=candidate.last_pack,
    )
