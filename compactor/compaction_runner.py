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
from typing import Protocol

from icecdc import summary
from icecdc.compactor import metrics, outcomes
from icecdc.compactor.outcomes import Outcome
from icecdc.compactor.plans import PartitionFiles, RewritePlan, plan_for
from icecdc.compactor.policy import Candidate
from icecdc.compactor.rewrite import Committer, CompactionResult
from icecdc.compactor.tracker import PartitionState
from icecdc.config import CompactorConfig
from icecdc.coordinator.ownership import Ownership, slot_of
from icecdc.errors import CatalogOutage
from icecdc.events import CompactionEvent
from icecdc.jvm.tables import CommittedSnapshot, Snapshot
from icecdc.layout import PartitionKey, TableLayout

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
        self, table: str, attempt: Callable[[], CommittedSnapshot], before_attempt: Callable[[], None] = ...
    ) -> CommittedSnapshot: ...
    def lease_lost(self, table: str) -> None: ...


class Publisher(Protocol):
    def compaction(self, event: CompactionEvent) -> None: ...


# (table, layout, partitions) -> one compaction job; partitions None: the table's global deletes.
CompactionFactory = Callable[[str, TableLayout, Sequence[PartitionKey] | None], Compaction]


class CompactionRunner:
    def __init__(
        self,
        *,
        replica: str,
        settings: CompactorConfig,
        leases: Leases,
        gate: Gate,
        compactions: CompactionFactory,
        publisher: Publisher,
        clock: Callable[[], float],
        on_start: Callable[[], None] = lambda: None,
        rng: random.Random | None = None,
    ) -> None:
        self._replica = replica
        self._settings = settings
        self._leases = leases
        self._gate = gate
        self._compactions = compactions
        self._publisher = publisher
        self._clock = clock
        self._on_start = on_start  # e.g. show the partition as compacting in the status at once
        self._rng = rng or random.Random()

    def run(self, job: Sequence[tuple[Candidate, PartitionState]], layout: TableLayout) -> list[CompactionEvent]:
        """One compaction job of the candidates' partitions, all of one table (one, or several
        that ``turns.job_partitions`` grouped): one event per partition. The job commits once for
        all, so every partition with work in it ends in the same outcome; a partition with
        nothing to do at the starting snapshot is skipped on its own."""
        table = job[0][0].table
        started = self._clock()
        for candidate, state in job:
            outcomes.begin(state, hot=candidate.hot)
            metrics.STARTED.labels(table, candidate.work.value).inc()
        self._on_start()
        attempts = [state.failures + 1 for _, state in job]
        kinds = [candidate.work.value for candidate, _ in job]
        reasons = [candidate.reason for candidate, _ in job]
        results: list[CompactionResult | None] = [None] * len(job)
        slots = sorted({slot_of(table, c.partition_path, self._leases.ownership.slots) for c, _ in job})
        what = f"compacting {table} {', '.join(c.partition_path or '(unpartitioned)' for c, _ in job)}"

        def event(i: int, outcome: Outcome, why: str, finished: float) -> CompactionEvent:
            state = job[i][1]
            return CompactionEvent.from_result(
                table=table,
                partition=state.partition,
                partition_path=state.path,
                kind=kinds[i],
                outcome=outcome,
                replica=self._replica,
                reason=why,
                attempt=attempts[i],
                started=started,
                finished=finished,
                result=results[i],
            )

        def confirm_leases() -> None:
            for slot in slots:
                self._leases.confirm(slot, what)

        ended: list[tuple[Outcome, str]] = []
        try:
            confirm_leases()
            is_global = job[0][1].is_global
            partitions = None if is_global else [tuple(s.partition.get(t.name) for t in layout.partition) for _, s in job]
            compaction = self._compactions(table, layout, partitions)
            listed = compaction.files()
            # An empty table has nothing to rewrite in any partition.
            plans = (
                [RewritePlan(c.work) for c, _ in job]
                if listed is None
                else [plan_for(c.work, files, self._settings, hot=c.hot) for (c, _), files in zip(job, listed, strict=True)]
            )
            nothing = "nothing to rewrite at the current snapshot"
            ended = [
                (Outcome.SKIPPED, f"{reasons[i]}; {nothing}") if p.empty else (Outcome.COMMITTED, reasons[i])
                for i, p in enumerate(plans)
            ]
            to_commit = [i for i, p in enumerate(plans) if not p.empty]
            if to_commit:
                start = compaction.starting_snapshot
                for i in to_commit:
                    kinds[i] = plans[i].work.value
                    results[i] = CompactionResult(plans[i].work, start.snapshot_id, start.sequence_number)
                    self._publisher.compaction(event(i, Outcome.STARTED, reasons[i], started))
                committed = compaction.run(
                    plans,
                    {summary.COMPACTOR: self._replica},
                    lambda commit: self._gate.commit(table, commit, before_attempt=confirm_leases),
                )
                results = [r if i in to_commit else None for i, r in enumerate(committed)]
        except CatalogOutage:
            raise  # the catalog is gone for good: the command stops
        except Exception as error:
            outcome = outcomes.outcome_of(error)
            why = f"{type(error).__name__}: {error}" if outcome is Outcome.FAILED else str(error)
            if outcome is Outcome.FENCED:
                self._gate.lease_lost(table)
            elif outcome is Outcome.FAILED:
                log.exception("compaction of %s failed", what)
            # Every partition the job had work for shares its end (one commit); the others, if it
            # got as far as planning, were skipped.
            ended = [e if e[0] is Outcome.SKIPPED else (outcome, why) for e in ended] or [(outcome, why)] * len(job)
        now = self._clock()
        events = []
        for i, (outcome, why) in enumerate(ended):
            state = job[i][1]
            resolution = outcomes.resolve(state, outcome, why, started=started, now=now, settings=self._settings, rng=self._rng)
            if resolution.settled_for is not None:
                metrics.SETTLE_TO_COMPACTED.labels(table).observe(resolution.settled_for)
            finished = event(i, resolution.outcome, resolution.reason, now)
            self._record(finished)
            events.append(finished)
        return events

    def _record(self, event: CompactionEvent) -> None:
        table = event.table
        metrics.FINISHED.labels(table, event.kind, event.outcome.value).inc()
        metrics.BYTES_READ.labels(table).inc(event.bytes_rewritten)
        metrics.BYTES_WRITTEN.labels(table).inc(event.bytes_added)
        metrics.DATA_FILES_REMOVED.labels(table).inc(event.data_files_rewritten)
        metrics.DATA_FILES_ADDED.labels(table).inc(event.data_files_added)
        metrics.DELETE_FILES_REMOVED.labels(table).inc(event.delete_files_removed)
        metrics.POSITION_DELETE_FILES_ADDED.labels(table).inc(event.position_delete_files_added)
        self._publisher.compaction(event)
        seconds = (event.finished_ms - event.started_ms) / 1000
        log.info(
            "%s %s %s: %s in %.1fs (%s; %d data files -> %d, %d delete files removed, %d position-delete files added)",
            event.kind,
            table,
            event.partition_path or "(unpartitioned)",
            event.outcome.value,
            seconds,
            event.reason,
            event.data_files_rewritten,
            event.data_files_added,
            event.delete_files_removed,
            event.position_delete_files_added,
            extra={
                "table": table,
                "partition": event.partition_path,
                "snapshot_id": event.snapshot_id,
                "sequence_number": event.sequence_number,
                "kind": event.kind,
                "outcome": event.outcome.value,
                "replica": self._replica,
            },
        )
