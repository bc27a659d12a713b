"""The redo loop of one micro-batch: run its job, and run it again after each schema change or
truncate the job finds, until a run finds none (``batch_decisions.BatchRedos`` decides).
It makes the schema changes on the tables and discards the files of runs it does over; it
commits no data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from icecdc.domain.layout import TableLayout
from icecdc.ingest import batch_decisions, metrics
from icecdc.ingest.batch_decisions import IngestStats, JobResult, Position, Truncates
from icecdc.ingest.evolution import ChangeKind, ColumnChange
from icecdc.ingest.job import BatchInput

log = logging.getLogger(__name__)


class EvolvingTable(Protocol):
    """What the redo loop changes on a table: its columns, and the files of a discarded run."""

    def delete_files(self, paths: Sequence[str]) -> list[str]: ...
    def add_column(self, name: str, iceberg_type: str) -> bool: ...
    def widen_column(self, name: str, iceberg_type: str) -> bool: ...


class RunningJob(Protocol):
    """A batch's job from the given positions on, without a truncated table's changes below its
    truncate's LSN (``job.BatchJob``)."""

    def run(
        self,
        batch: BatchInput,
        layouts: Mapping[str, TableLayout],
        positions: Mapping[Position, int],
        tag: str,
        truncate_lsns: Mapping[str, int],
    ) -> JobResult: ...


@dataclass(frozen=True)
class JobRuns:
    """A batch's job as the redo loop leaves it. The first run read every new record, so the
    offsets and counts come from it; the last run holds the files to commit."""

    first: JobResult
    last: JobResult
    truncated: Truncates


class RedoLoop:
    """Runs a batch's job until no run asks for a redo. ``layouts`` is the batch runner's own
    mapping: a schema change updates it in place, so the next run and the commit see it."""

    def __init__(
        self,
        *,
        tables: Mapping[str, EvolvingTable],
        layouts: MutableMapping[str, TableLayout],
        job: RunningJob,
        load_layout: Callable[[str], TableLayout],
        stats: IngestStats,
        failpoint: Callable[[str], None],
    ) -> None:
        self._tables = tables
        self._layouts = layouts
        self._job = job
        self._load_layout = load_layout
        self._stats = stats
        self._failpoint = failpoint

    def run(self, batch: BatchInput, positions: Mapping[Position, int], tag: str) -> JobRuns:
        first = job = self._job.run(batch, self._layouts, positions, tag, {})
        self._stats.last_job_seconds = job.seconds
        redos = batch_decisions.BatchRedos(tag, positions)
        while (redo := redos.after(job)) is not None:
            self._discard(job)
            for table, changes in redo.schema_changes.items():
                self._evolve(table, changes)
            job = self._job.run(batch, self._layouts, redo.positions, tag, redo.truncate_lsns)
            self._stats.last_job_seconds += job.seconds
        metrics.JOB_SECONDS.labels("driver" if job.in_driver else "spark").observe(self._stats.last_job_seconds)
        return JobRuns(first, job, redos.truncated)

    def _discard(self, job: JobResult) -> None:
        """A run done over leaves its files unreferenced: delete them now, not as orphans later."""
        for table in job.files:
            self._tables[table].delete_files(job.written_paths(table))

    def _evolve(self, table: str, changes: Sequence[ColumnChange]) -> None:
        """Each change its own metadata commit, before the batch's data commit; a crash between
        them leaves the change made, and the batch, done again, finds nothing to change."""
        iceberg = self._tables[table]
        for change in changes:
            made = (
                iceberg.add_column(change.column, change.iceberg_type)
                if change.kind is ChangeKind.ADD
                else iceberg.widen_column(change.column, change.iceberg_type)
            )
            if made:
                metrics.SCHEMA_CHANGES.labels(table, change.kind.value).inc()
                log.info("%s: %s (the source's schema changed)", table, change, extra={"table": table})
            self._failpoint("after-schema-change")
        self._layouts[table] = batch_decisions.reloaded_layout(self._layouts[table], self._load_layout(table))
