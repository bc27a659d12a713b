"""Running one compaction of one due partition: confirm the lease, list and plan at the current
snapshot, announce it (``started``, with its starting snapshot), rewrite, commit through the
coordinator's gate, and report the outcome (``outcomes``) as a compaction event, metrics and a
log line. Every client is injected, so each outcome can be driven by fakes in a unit test.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
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
    """One compaction of one partition (``rewrite.PartitionCompaction``)."""

    def files(self) -> PartitionFiles | None: ...
    @property
    def starting_snapshot(self) -> Snapshot: ...
    def run(self, plan: RewritePlan, tags: dict[str, str], commit: Committer) -> CompactionResult: ...


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


# (table, layout, partition) -> one compaction; partition None: the table's global deletes.
CompactionFactory = Callable[[str, TableLayout, PartitionKey | None], Compaction]


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

    def run(self, candidate: Candidate, state: PartitionState, layout: TableLayout) -> CompactionEvent:
        table = candidate.table
        started = self._clock()
        outcomes.begin(state, hot=candidate.hot)
        self._on_start()
        metrics.STARTED.labels(table, candidate.work.value).inc()
        attempt = state.failures + 1
        kind, reason = candidate.work.value, candidate.reason
        result: CompactionResult | None = None
        slot = slot_of(table, candidate.partition_path, self._leases.ownership.slots)
        what = f"compacting {table} {candidate.partition_path or '(unpartitioned)'}"

        def event(outcome: Outcome, why: str, finished: float) -> CompactionEvent:
            return CompactionEvent.from_result(
                table=table,
                partition=state.partition,
                partition_path=state.path,
                kind=kind,
                outcome=outcome,
                replica=self._replica,
                reason=why,
                attempt=attempt,
                started=started,
                finished=finished,
                result=result,
            )

        try:
            self._leases.confirm(slot, what)
            partition = None if state.is_global else tuple(state.partition.get(term.name) for term in layout.partition)
            compaction = self._compactions(table, layout, partition)
            files = compaction.files()
            plan = plan_for(candidate.work, files, self._settings, hot=candidate.hot) if files is not None else None
            if plan is None or plan.empty:
                outcome, reason = Outcome.SKIPPED, f"{reason}; nothing to rewrite at the current snapshot"
            else:
                kind = plan.work.value
                start = compaction.starting_snapshot
                result = CompactionResult(plan.work, start.snapshot_id, start.sequence_number)
                self._publisher.compaction(event(Outcome.STARTED, reason, started))
                result = compaction.run(
                    plan,
                    {summary.COMPACTOR: self._replica},
                    lambda commit: self._gate.commit(table, commit, before_attempt=lambda: self._leases.confirm(slot, what)),
                )
                outcome = Outcome.COMMITTED
        except CatalogOutage:
            raise  # the catalog is gone for good: the command stops
        except Exception as error:
            outcome = outcomes.outcome_of(error)
            reason = f"{type(error).__name__}: {error}" if outcome is Outcome.FAILED else str(error)
            if outcome is Outcome.FENCED:
                self._gate.lease_lost(table)
            elif outcome is Outcome.FAILED:
                log.exception("compaction of %s %s failed", table, candidate.partition_path)
        now = self._clock()
        resolution = outcomes.resolve(state, outcome, reason, started=started, now=now, settings=self._settings, rng=self._rng)
        if resolution.settled_for is not None:
            metrics.SETTLE_TO_COMPACTED.labels(table).observe(resolution.settled_for)
        finished = event(resolution.outcome, resolution.reason, now)
        self._record(finished)
        return finished

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
