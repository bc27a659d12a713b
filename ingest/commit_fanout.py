"""The commit fan-out of one micro-batch: each table's commit of the batch, the tables side by side
on the commit threads, each followed by its commit event. ``batch_decisions.table_commits``
decides what each commit holds; this module only carries the commits out, counts and publishes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from concurrent.futures import Executor, wait
from dataclasses import replace
from typing import NamedTuple, Protocol

from icecdc.domain.errors import MissingPartitionSpec
from icecdc.domain.events import CommitEvent
from icecdc.domain.layout import TableLayout
from icecdc.domain.sourcespec import SourceRules
from icecdc.ingest import batch_decisions, metrics
from icecdc.ingest.batch_decisions import IngestStats, JobResult, TableCommit
from icecdc.ingest.filemeta import FileKind
from icecdc.jvm.tables import CommittedSnapshot

log = logging.getLogger(__name__)


class CommittingTable(Protocol):
    """What a table's commit of a batch calls (``jvm.tables.IcebergTable``)."""

    def commit_files(
        self, what: str, data: Sequence[str], deletes: Sequence[str], summary: Mapping[str, str]
    ) -> CommittedSnapshot: ...
    def commit_truncate(self, what: str, data: Sequence[str], summary: Mapping[str, str]) -> CommittedSnapshot: ...
    def delete_files(self, paths: Sequence[str]) -> list[str]: ...
    def ensure_unpartitioned_spec(self) -> int: ...


class CommitEvents(Protocol):
    def publish(self, event: CommitEvent) -> None: ...


class TableCommitted(NamedTuple):
    table: str
    snapshot: CommittedSnapshot
    seconds: float  # how long its Iceberg commit took


class CommitFanOut:
    """Commits a batch's tables. ``layouts`` is the batch runner's own mapping: a lost
    unpartitioned spec, added again, is recorded there for the next batches."""

    def __init__(
        self,
        *,
        tables: Mapping[str, CommittingTable],
        layouts: MutableMapping[str, TableLayout],
        rules: Mapping[str, SourceRules],
        events: CommitEvents,
        pool: Executor,
        stats: IngestStats,
        failpoint: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tables = tables
        self._layouts = layouts
        self._rules = rules
        self._events = events
        self._pool = pool
        self._stats = stats
        self._failpoint = failpoint
        self._clock = clock
        self._bookkeeping = threading.Lock()  # what commits on several threads share
        self._told_global: set[str] = set()  # tables whose first global deletes were explained in the log

    def commit_all(self, commits: Sequence[TableCommit], job: JobResult) -> list[TableCommitted]:
        """Every table's commit; an error of one is raised once every other commit has ended."""
        if len(commits) > 1:
            # Each table's commit is its own (its offsets ride in it), so they need no order; a
            # commit is mostly waiting on files and the catalog, so the tables commit side by side.
            futures = [self._pool.submit(self._commit_one, planned, job) for planned in commits]
            wait(futures)
            return [future.result() for future in futures]
        return [self._commit_one(planned, job) for planned in commits]

    def _commit_one(self, planned: TableCommit, job: JobResult) -> TableCommitted:
        """One table's commit, its counts and its event; called on several threads at once for
        different tables (what they share is updated under ``_bookkeeping``)."""
        layout = self._layouts[planned.table]  # the event describes the files by the layout they were written in
        started = self._clock()
        snapshot = self._truncate(planned) if planned.truncate else self._commit_files(planned, layout)
        seconds = self._clock() - started
        self._count(planned, snapshot, seconds)
        event = batch_decisions.commit_event(planned, snapshot, layout, job.unknown_columns.get(planned.table, {}))
        with self._bookkeeping:  # the publisher keeps undelivered events to send again
            self._events.publish(event)
        self._failpoint("after-commit")
        return TableCommitted(planned.table, snapshot, seconds)

    def _truncate(self, planned: TableCommit) -> CommittedSnapshot:
        table = self._tables[planned.table]
        table.delete_files(planned.discarded)
        snapshot = table.commit_truncate(planned.what, planned.data, planned.summary)
        metrics.TRUNCATES.labels(planned.table).inc()
        log.info("%s: truncated by the source (batch %s)", planned.table, planned.batch_id, extra={"table": planned.table})
        return snapshot

    def _commit_files(self, planned: TableCommit, layout: TableLayout) -> CommittedSnapshot:
        table = self._tables[planned.table]
        try:
            return table.commit_files(planned.what, planned.data, planned.deletes, planned.summary)
        except MissingPartitionSpec as missing:
            # The unpartitioned spec of the global deletes was expired with the metadata that no
            # live file used any more: add it again and name it in this batch's files.
            spec_id = table.ensure_unpartitioned_spec()
            self._layouts[planned.table] = replace(layout, global_spec_id=spec_id)
            deletes = [batch_decisions.with_spec_id(d, missing.spec_id, spec_id) for d in planned.deletes]
            return table.commit_files(planned.what, planned.data, deletes, planned.summary)

    def _count(self, planned: TableCommit, snapshot: CommittedSnapshot, seconds: float) -> None:
        name, global_deletes = planned.table, planned.rows(FileKind.GLOBAL_DELETE)
        with self._bookkeeping:
            self._stats.count_commit(planned, snapshot, seconds)
            explain_global = bool(planned.global_delete_files) and name not in self._told_global
            if explain_global:
                self._told_global.add(name)
        metrics.COMMITS.labels(name).inc()
        metrics.COMMIT_SECONDS.labels(name).observe(seconds)
        metrics.COMMIT_INTERLEAVED.labels(name).inc(snapshot.interleaved)
        metrics.ROWS_WRITTEN.labels(name, "data").inc(planned.rows(FileKind.DATA))
        metrics.ROWS_WRITTEN.labels(name, "equality-delete").inc(planned.rows(FileKind.DELETE))
        metrics.ROWS_WRITTEN.labels(name, "global-equality-delete").inc(global_deletes)
        if explain_global:
            log.info(
                "%s: %d keys whose old partition is unknown (before_image: %s) were deleted in every partition; the "
                "compactor resolves such global deletes. A source that sends the whole old row (MySQL's default, "
                "PostgreSQL with REPLICA IDENTITY FULL) needs none: set before_image: full (docs/ingest.md)",
                name,
                global_deletes,
                self._rules[name].before_image.value,
                extra={"table": name},
            )
