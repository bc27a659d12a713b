"""Running one compaction job of one due partition, or of several small settled ones of a table
(``scheduler.job_partitions``), step by step: begin (mark the partitions compacting), list their
files, plan each at the current snapshot, work (announce each with its starting snapshot,
rewrite, commit once through the coordinator's gate), and resolve each partition's outcome
(``outcomes``) into a compaction event, metrics and a log line. Every client is injected, so a
unit test can drive each outcome with fakes.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from icecdc.compactor import metrics
from icecdc.compactor.job_progress import Failure, JobPartition, JobPhases, JobUnderWay, failure_of, partition_key
from icecdc.compactor.key_index import KeyIndex
from icecdc.compactor.outcomes import Outcome
from icecdc.compactor.plans import PartitionFiles, RewritePlan
from icecdc.compactor.policy import Candidate
from icecdc.compactor.rewrite import Committer, CompactionResult
from icecdc.compactor.tracker import PartitionTracker, TrackedPartition
from icecdc.coordinator.commits import Attempt
from icecdc.coordinator.ownership import Ownership, slot_of
from icecdc.domain import summary
from icecdc.domain.errors import CatalogOutage
from icecdc.domain.events import CompactionEvent
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
        attempt: Attempt,
        before_attempt: Callable[[], int | None] = ...,
        commit_by: float | None = ...,
    ) -> CommittedSnapshot: ...
    def lease_lost(self, table: str) -> None: ...


class Publisher(Protocol):
    def compaction(self, event: CompactionEvent) -> None: ...


# (table, starting sequence number, partition paths) -> the snapshot it checked the writer's
# commits through (None: it did not check), right before each commit attempt; raises
# ``WriterWroteThere`` when the table's writer forbids the commit (``policy.beside_writer``).
WriterGuard = Callable[[str, int, Sequence[str]], int | None]

# (table, layout, partitions) -> one compaction job; partitions None: the table's global deletes.
CompactionFactory = Callable[[str, TableLayout, Sequence[PartitionKey] | None], Compaction]


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
        writer_guard: WriterGuard = lambda table, since, paths: None,
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
        self._writer_guard = writer_guard

    def run(self, job: Sequence[tuple[Candidate, TrackedPartition]], layout: TableLayout) -> list[CompactionEvent]:
        """One compaction job of the candidates' partitions, all of one table (one, or several
        that ``scheduler.job_partitions`` grouped): one event per partition. The job commits once
        for all, so every partition with work in it ends in the same outcome; a partition with
        nothing to do at the starting snapshot is skipped on its own."""
        under_way = self._begin(job, layout)
        failure: Failure | None = None
        try:
            self._confirm_leases(under_way)
            compaction = self._compactions(under_way.table, layout, under_way.keys)
            plans = under_way.plan(self._list(under_way, compaction), self._settings)
            if under_way.has_work:
                self._announce(under_way, compaction.starting_snapshot)
                self._work(under_way, compaction, plans)
        except CatalogOutage:
            raise  # the catalog is gone for good: the command stops
        except Exception as error:  # noqa: BLE001 (any other error is the job's outcome; ``_failed`` logs it)
            failure = self._failed(under_way, error)
        return self._resolve(under_way, failure)

    def _begin(self, job: Sequence[tuple[Candidate, TrackedPartition]], layout: TableLayout) -> JobUnderWay:
        """Marks each partition compacting in the tracker, counts its start and shows it at once."""
        table = job[0][0].table
        started = self._clock()
        slot_count = self._leases.ownership.slots
        parts = [
            JobPartition(
                c,
                p,
                slot_of(table, c.partition_path, slot_count),
                self._tracker.begin(p, hot=c.hot, answers=c.due_by is None, last_pack=c.last_pack).attempt,
                c.reason,
            )
            for c, p in job
        ]
        for part in parts:
            metrics.STARTED.labels(table, part.kind.value).inc()
        self._on_start()
        return JobUnderWay(table, layout, parts, started)

    def _confirm_leases(self, job: JobUnderWay) -> None:
        for slot in job.slots:
            self._leases.confirm(slot, job.what)

    def _list(self, job: JobUnderWay, compaction: Compaction) -> list[PartitionFiles] | None:
        """Each partition's live files at the starting snapshot (None: the table is empty)."""
        listed = compaction.files()
        job.phases.listing = self._clock() - job.started
        return listed

    def _announce(self, job: JobUnderWay, start: Snapshot) -> None:
        """Publishes each partition with work as started, with the snapshot the job starts from."""
        job.start_from(start.snapshot_id, start.sequence_number)
        for part in job.parts:
            if part.has_work:
                self._publisher.compaction(self._event(part, job.started, job.started))

    def _work(self, job: JobUnderWay, compaction: Compaction, plans: Sequence[RewritePlan]) -> None:
        """Rewrites or converts the planned files and commits them once (``_commit``)."""
        working = self._clock()
        results = compaction.run(plans, {summary.COMPACTOR: self._replica}, functools.partial(self._commit, job))
        job.phases.work = self._clock() - working - job.phases.commit
        job.finish_with([result.counts for result in results])

    def _commit(self, job: JobUnderWay, attempt: Attempt) -> CommittedSnapshot:
        """One commit through the gate, which confirms the leases and asks the writer guard
        before each attempt."""
        at = self._clock()
        try:
            return self._gate.commit(
                job.table, attempt, before_attempt=functools.partial(self._before_commit, job), commit_by=job.commit_by
            )
        finally:
            job.phases.commit += self._clock() - at

    def _before_commit(self, job: JobUnderWay) -> int | None:
        self._confirm_leases(job)
        since = job.starting_sequence_number
        if since is None:
            return None
        return self._writer_guard(job.table, since, [part.partition.path for part in job.parts if part.has_work])

    def _failed(self, job: JobUnderWay, error: Exception) -> Failure:
        """How the job ends after ``error``: the gate counts a fenced job as a lease conflict,
        and an unexpected failure is logged with its traceback."""
        failure = failure_of(error)
        if failure[0] is Outcome.FENCED:
            self._gate.lease_lost(job.table)
        elif failure[0] is Outcome.FAILED:
            log.exception("compaction of %s failed", job.what)
        return failure

    def _resolve(self, job: JobUnderWay, failure: Failure | None) -> list[CompactionEvent]:
        """Re-reads the table (``on_finish``), then ends and reports each partition."""
        finishing = self._clock()
        self._on_finish(job.table)
        now = self._clock()
        job.phases.reread = now - finishing
        events = [self._end(job, part, failure, now) for part in job.parts]
        self._follow_key_index(job, [event.outcome for event in events])
        return events

    def _end(self, job: JobUnderWay, part: JobPartition, failure: Failure | None, now: float) -> CompactionEvent:
        """The partition's next state in the tracker, and its final event, published and logged."""
        resolution = self._tracker.resolve(part.partition, *part.ending(failure), started=job.started, now=now, rng=self._rng)
        if resolution.settled_for is not None:
            metrics.SETTLE_TO_COMPACTED.labels(job.table).observe(resolution.settled_for)
        finished = self._event(replace(part, outcome=resolution.outcome, reason=resolution.reason), job.started, now)
        self._record(finished, job.phases)
        return finished

    def _follow_key_index(self, job: JobUnderWay, ended: Sequence[Outcome]) -> None:
        """A settled partition whose data a committed job rewrote leaves the key index
        (``JobPartition.leaves_key_index``); the index's size per table goes to the metrics."""
        if self._key_index is None:
            return
        for part, outcome in zip(job.parts, ended, strict=True):
            if part.leaves_key_index(outcome):
                self._key_index.drop((job.table, partition_key(part.partition, job.layout)))
        held = self._key_index.usage(lambda partition: partition[0] if isinstance(partition, tuple) else partition)
        held_bytes, held_keys = held.get(job.table, (0, 0))
        metrics.KEY_INDEX_BYTES.labels(job.table).set(held_bytes)
        metrics.KEY_INDEX_KEYS.labels(job.table).set(held_keys)

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
