"""Running one compaction job of one due partition, or of several small settled ones of a table
(``turns.job_partitions``): confirm the leases, list and plan each partition at the current
snapshot, announce each (``started``, with the starting snapshot), rewrite, commit once through
the coordinator's gate, and report each partition's outcome (``outcomes``) as a compaction event,
metrics and a log line. Every client is injected, so each outcome can be driven by fakes in a unit test.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from icecdc.compactor import metrics, outcomes
from icecdc.compactor.key_index import KeyIndex
from icecdc.compactor.outcomes import Outcome
from icecdc.compactor.plans import CONVERSIONS, PartitionFiles, RewritePlan, plan_for
from icecdc.compactor.policy import Candidate, Work
from icecdc.compactor.rewrite import Committer, CompactionResult
from icecdc.compactor.tracker import PartitionTracker, TrackedPartition
from icecdc.coordinator.ownership import Ownership, slot_of
from icecdc.domain import summary
from icecdc.domain.errors import CatalogOutage
from icecdc.domain.events import CompactionCounts, CompactionEvent
from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.jvm.tables import CommittedSnapshot, Snapshot
from icecdc.runtime.config import CompactorConfig

log = logging.getLogger(__name__)


class Compaction(Protocol):
    """One compaction job of one or more partitions of a table (``rewrite.CompactionJob``)."""

    def files(self) -> list[PartitionFiles] | None: ...
    @property
    def starting_snapshot(self) -> Snapshot: ...
    def run(self, plans: Sequence[RewritePlan], tags: dict[str, str], commit: Committer) -> list[CompactionResult]: ...


class Leases(Protocol):
    @property
    def ownership(self) -> Ownership: ...
    def confirm(self, slot: int, what: str) -> None: ...


class Gate(Protocol):
    def commit(
        self,
        table: str,
        attempt: Callable[[], CommittedSnapshot],
        before_attempt: Callable[[], None] = ...,
        commit_by: float | None = ...,
    ) -> CommittedSnapshot: ...
    def lease_lost(self, table: str) -> None: ...


class Publisher(Protocol):
    def compaction(self, event: CompactionEvent) -> None: ...


# (table, layout, partitions) -> one compaction job; partitions None: the table's global deletes.
CompactionFactory = Callable[[str, TableLayout, Sequence[PartitionKey] | None], Compaction]


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

    def ending(self, failure: tuple[Outcome, str] | None) -> tuple[Outcome, str]:
        """How its attempt ended, when the job ended in ``failure`` (None: it did not fail):
        the job commits once, so every partition it had work for shares its end; one with
        nothing to do at the starting snapshot was skipped whatever became of the others."""
        if self.plan is not None and self.plan.empty:
            return Outcome.SKIPPED, f"{self.reason}; nothing to rewrite at the current snapshot"
        return failure or (Outcome.COMMITTED, self.reason)


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


class CompactionRunner:
    def __init__(
        self,
        *,
        replica: str,
        settings: CompactorConfig,
        tracker: PartitionTracker,
        leases: Leases,
        gate: Gate,
        compactions: CompactionFactory,
        publisher: Publisher,
        clock: Callable[[], float],
        on_start: Callable[[], None] = lambda: None,
        on_finish: Callable[[str], None] = lambda table: None,
        rng: random.Random | None = None,
        key_index: KeyIndex | None = None,
    ) -> None:
        self._replica = replica
        self._settings = settings
        self._tracker = tracker
        self._leases = leases
        self._gate = gate
        self._compactions = compactions
        self._publisher = publisher
        self._clock = clock
        self._on_start = on_start  # e.g. show the partition as compacting in the status at once
        # Before a job's end is reported: re-read the table (its events then tell the table's
        # portability after the commit).
        self._on_finish = on_finish
        self._rng = rng or random.Random()
        self._key_index = key_index

    def run(self, job: Sequence[tuple[Candidate, TrackedPartition]], layout: TableLayout) -> list[CompactionEvent]:
        """One compaction job of the candidates' partitions, all of one table (one, or several
        that ``turns.job_partitions`` grouped): one event per partition. The job commits once for
        all, so every partition with work in it ends in the same outcome; a partition with
        nothing to do at the starting snapshot is skipped on its own."""
        table = job[0][0].table
        started = self._clock()
        slot_count = self._leases.ownership.slots
        parts = [
            JobPartition(
                c,
                p,
                slot_of(table, c.partition_path, slot_count),
                self._tracker.begin(p, hot=c.hot, answers=c.due_by is None).attempt,
                c.reason,
            )
            for c, p in job
        ]
        slots = sorted({part.slot for part in parts})
        for part in parts:
            metrics.STARTED.labels(table, part.kind.value).inc()
        self._on_start()
        what = f"compacting {table} {', '.join(c.partition_path or '(unpartitioned)' for c, _ in job)}"

        def confirm_leases() -> None:
            for slot in slots:
                self._leases.confirm(slot, what)

        phases = JobPhases()
        # The portability target's deadline, for the conversions it asked for: the commit does not
        # wait for the writer's quiet window past it.
        commit_by = min((c.due_by for c, _ in job if c.due_by is not None), default=None)

        def through_gate(commit: Callable[[], CommittedSnapshot]) -> CommittedSnapshot:
            at = self._clock()
            try:
                return self._gate.commit(table, commit, before_attempt=confirm_leases, commit_by=commit_by)
            finally:
                phases.commit += self._clock() - at

        failure: tuple[Outcome, str] | None = None
        try:
            confirm_leases()
            keys = None if parts[0].partition.is_global else [_key(part.partition, layout) for part in parts]
            compaction = self._compactions(table, layout, keys)
            listed = compaction.files()
            phases.listing = self._clock() - started
            plans = (
                [RewritePlan(part.candidate.work) for part in parts]  # an empty table: nothing to rewrite anywhere
                if listed is None
                else [
                    plan_for(
                        part.candidate.work,
                        files,
                        self._settings,
                        hot=part.candidate.hot,
                        portable=part.candidate.due_by is not None,
                        deletion_vectors=layout.format_version >= 3,
                    )
                    for part, files in zip(parts, listed, strict=True)
                ]
            )
            parts = [replace(part, plan=plan) for part, plan in zip(parts, plans, strict=True)]
            if any(part.has_work for part in parts):
                start = compaction.starting_snapshot
                at_start = CompactionCounts(
                    starting_snapshot_id=start.snapshot_id, starting_sequence_number=start.sequence_number
                )
                parts = [replace(part, counts=at_start) if part.has_work else part for part in parts]
                for part in parts:
                    if part.has_work:
                        self._publisher.compaction(self._event(part, started, started))
                working = self._clock()
                results = compaction.run(plans, {summary.COMPACTOR: self._replica}, through_gate)
                phases.work = self._clock() - working - phases.commit
                parts = [
                    replace(part, counts=result.counts) if part.has_work else part
                    for part, result in zip(parts, results, strict=True)
                ]
        except CatalogOutage:
            raise  # the catalog is gone for good: the command stops
        except Exception as error:
            outcome = outcomes.outcome_of(error)
            failure = (outcome, f"{type(error).__name__}: {error}" if outcome is Outcome.FAILED else str(error))
            if outcome is Outcome.FENCED:
                self._gate.lease_lost(table)
            elif outcome is Outcome.FAILED:
                log.exception("compaction of %s failed", what)
        finishing = self._clock()
        self._on_finish(table)
        now = self._clock()
        phases.reread = now - finishing
        events = []
        for part in parts:
            resolution = self._tracker.resolve(part.partition, *part.ending(failure), started=started, now=now, rng=self._rng)
            if resolution.settled_for is not None:
                metrics.SETTLE_TO_COMPACTED.labels(table).observe(resolution.settled_for)
            finished = self._event(replace(part, outcome=resolution.outcome, reason=resolution.reason), started, now)
            self._record(finished, phases)
            events.append(finished)
        self._follow_key_index(table, parts, layout, [e.outcome for e in events])
        return events

    def _follow_key_index(self, table: str, parts: Sequence[JobPartition], layout: TableLayout, ended: Sequence[Outcome]) -> None:
        """A settled partition whose data a committed job rewrote leaves the key index (its
        conversions are done; were it written again, its next conversion rebuilds it); and the
        index's size per table goes to the metrics."""
        if self._key_index is None:
            return
        for part, outcome in zip(parts, ended, strict=True):
            rewrote = part.plan is not None and bool(part.plan.rewrite) and part.plan.work not in CONVERSIONS
            if outcome is Outcome.COMMITTED and rewrote and not part.candidate.hot and not part.partition.is_global:
                self._key_index.drop((table, _key(part.partition, layout)))
        held = self._key_index.usage(lambda partition: partition[0] if isinstance(partition, tuple) else partition)
        held_bytes, held_keys = held.get(table, (0, 0))
        metrics.KEY_INDEX_BYTES.labels(table).set(held_bytes)
        metrics.KEY_INDEX_KEYS.labels(table).set(held_keys)

    def _event(self, part: JobPartition, started: float, finished: float) -> CompactionEvent:
        portability = self._tracker.portability(part.candidate.table)
        return CompactionEvent.from_result(
            table=part.candidate.table,
            partition=part.partition.partition,
            partition_path=part.partition.path,
            kind=part.kind,
            outcome=part.outcome,
            replica=self._replica,
            reason=part.reason,
            attempt=part.attempt,
            started=started,
            finished=finished,
            counts=part.counts,
            oldest_equality_delete_age_seconds=round(portability.oldest_age(finished), 3),
            portable=portability.portable,
        )

    def _record(self, event: CompactionEvent, phases: JobPhases) -> None:
        table = event.table
        metrics.compaction_finished(table, event.kind, event.outcome, event)
        self._publisher.compaction(event)
        seconds = (event.finished_ms - event.started_ms) / 1000
        log.info(
            "%s %s %s: %s in %.1fs (%s; %d data files -> %d, %d delete files removed, %d position-delete files added; %s)",
            event.kind.value,
            table,
            event.partition_path or "(unpartitioned)",
            event.outcome.value,
            seconds,
            event.reason,
            event.data_files_rewritten,
            event.data_files_added,
            event.delete_files_removed,
            event.position_delete_files_added,
            phases,
            extra={
                "table": table,
                "partition": event.partition_path,
                "snapshot_id": event.snapshot_id,
                "sequence_number": event.sequence_number,
                "kind": event.kind.value,
                "outcome": event.outcome.value,
                "replica": self._replica,
            },
        )


def _key(partition: TrackedPartition, layout: TableLayout) -> PartitionKey:
    """The partition's values, in the order of the table's partition fields."""
    return tuple(partition.partition.get(t.name) for t in layout.partition)
