"""The micro-batch writer: a ``foreachBatch(df, batch_id)`` function that any Structured Streaming
query over Kafka-shaped rows can call, and that the direct Kafka source calls too.

Order of work in one batch, and why:
1. read each table's committed offsets from its snapshot history (exactly-once filter);
2. parse, reduce and write files (``stages``), on Spark's executors, or in the driver for a
   small batch the direct reader holds there (``job``);
3. send rejected records to the dead-letter topic and wait for delivery (before the commit, so
   a crash can at worst send a dead letter twice, never lose one);
4. per table, one RowDelta commit with the files and the advanced offsets (never two batches in
   one commit: their equality deletes must not share a sequence number with older data);
5. publish a commit event per commit.
A crash anywhere before 4 leaves only unreferenced files (orphans); after 4 the table's offsets
make the replay a no-op.

``BatchRunner`` keeps that order over what it is given (the tables, the job, the dead-letter
topic, the commit events), with ``batch_decisions`` deciding; ``BatchWriter`` wires it to Iceberg, Spark and
Kafka.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from icecdc.domain import summary as summary_keys
from icecdc.domain.errors import MissingPartitionSpec, NoSuchTable
from icecdc.domain.events import CommitEvent
from icecdc.domain.layout import TableLayout, layout_from_pyiceberg
from icecdc.domain.sourcespec import SourceRules
from icecdc.ingest import batch_decisions, metrics, unavailable
from icecdc.ingest import offsets as offset_log
from icecdc.ingest.batch_decisions import DeadLetter, IngestStats, JobResult, Position, TableCommit, Truncates, WrittenFile
from icecdc.ingest.evolution import ChangeKind, ColumnChange
from icecdc.ingest.filemeta import FileKind
from icecdc.ingest.job import BatchInput, BatchJob
from icecdc.ingest.prefixes import SchemaPrefixes
from icecdc.ingest.publish import CommitEventPublisher, DeadLetterTopic
from icecdc.ingest.unavailable import Key, unavailable_detail
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import CommittedSnapshot, IcebergTable, write_local_files_in_process
from icecdc.runtime import failpoints
from icecdc.runtime.catalog import load_metadata_table, local_warehouse, metadata_call, pyiceberg_catalog
from icecdc.runtime.config import Config
from icecdc.runtime.outages import CatalogRetry

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class Table(Protocol):
    """What a batch reads from and commits to one table (``jvm.tables.IcebergTable``)."""

    def summaries_back_to(self, key: str) -> Sequence[Mapping[str, str]]: ...
    def commit_files(
        self, what: str, data: Sequence[str], deletes: Sequence[str], summary: Mapping[str, str]
    ) -> CommittedSnapshot: ...
    def commit_truncate(self, what: str, data: Sequence[str], summary: Mapping[str, str]) -> CommittedSnapshot: ...
    def delete_files(self, paths: Sequence[str]) -> list[str]: ...
    def add_column(self, name: str, iceberg_type: str) -> bool: ...
    def widen_column(self, name: str, iceberg_type: str) -> bool: ...
    def ensure_unpartitioned_spec(self) -> int: ...
    def key_rows(
        self, key_columns: Sequence[str], keys: Collection[Key], columns: Sequence[str], snapshot_id: int | None = None
    ) -> dict[Key, dict[str, Any]]: ...


class Job(Protocol):
    """A batch's job, in the driver or on Spark, from the given positions on, without a truncated
    table's changes below its truncate's LSN (``job.BatchJob``)."""

    def run(
        self,
        batch: BatchInput,
        layouts: Mapping[str, TableLayout],
        positions: Mapping[Position, int],
        tag: str,
        truncate_lsns: Mapping[str, int],
    ) -> JobResult: ...
    def write_rows(self, layout: TableLayout, rows: Sequence[dict[str, Any]], tag: str) -> list[WrittenFile]: ...
    @property
    def prefixes(self) -> SchemaPrefixes: ...


class DeadLetters(Protocol):
    """The dead-letter topic: ``send`` returns once every letter is delivered, or raises."""

    def send(self, letters: Iterable[DeadLetter]) -> int: ...


class CommitEvents(Protocol):
    def publish(self, event: CommitEvent) -> None: ...


@dataclass(frozen=True)
class BatchResult:
    batch_id: str
    records: int
    dead_letters: int
    commits: dict[str, CommittedSnapshot]
    seconds: float
    # table -> how long its Iceberg commit took (the writer's commit latency, per table).
    commit_seconds: dict[str, float] = field(default_factory=dict)
    offsets_seconds: float = 0.0  # reading the tables' committed offsets at the batch's start
    commits_wall_seconds: float = 0.0  # every table's commit, side by side, start to end
    job_in_driver: bool = False  # the job ran in the driver, not on Spark (``job.BatchJob``)


class BatchRunner:
    """Runs micro-batches, in the order above, through the tables, job, dead-letter topic and
    commit events it is given; ``load_layout`` reads a table's layout again after a schema change."""

    def __init__(
        self,
        *,
        tables: Mapping[str, Table],
        layouts: Mapping[str, TableLayout],
        rules: Mapping[str, SourceRules],
        job: Job,
        dead_letters: DeadLetters,
        events: CommitEvents,
        load_layout: Callable[[str], TableLayout],
        commit_pool: Executor,
        source_name: str = "kafka",
        failpoint: Callable[[str], None] = failpoints.hit,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tables = dict(tables)
        self.layouts = dict(layouts)
        self.rules = dict(rules)
        self.source_name = source_name
        self.stats = IngestStats()
        self._job = job
        self._dead_letters = dead_letters
        self._events = events
        self._load_layout = load_layout
        self._commit_pool = commit_pool
        self._failpoint = failpoint
        self._clock = clock
        self._bookkeeping = threading.Lock()  # what commits on several threads share
        self._told_global: set[str] = set()  # tables whose first global deletes were explained in the log
        self._told_unknown: set[tuple[str, str]] = set()  # (table, field) named in the log already
        # table -> the earlier batches' primary-key changes whose create may still come (``unavailable``)
        self._pending_moves: dict[str, unavailable.PendingMoves] = defaultdict(unavailable.PendingMoves)

    def committed_offsets(self) -> dict[str, offset_log.Offsets]:
        """table -> its committed offsets, read from the table (the source of truth), the tables
        side by side on the commit threads: each read refreshes its table, a catalog query and
        often the metadata file its last commit wrote."""

        def read(table: Table) -> offset_log.Offsets:
            return offset_log.committed_offsets(table.summaries_back_to(summary_keys.OFFSETS))

        return dict(zip(self.tables, self._commit_pool.map(read, self.tables.values()), strict=True))

    def topic_positions(self, committed: Mapping[str, offset_log.Offsets]) -> dict[Position, int]:
        """(topic, partition) -> next offset to read, each topic as committed by its own table."""
        return batch_decisions.topic_positions(self.layouts, committed)

    @property
    def prefixes(self) -> SchemaPrefixes:
        return self._job.prefixes

    def run(self, batch: BatchInput, batch_id: int | str) -> BatchResult:
        started = self._clock()
        tag = f"{self.source_name}:{batch_id}"
        committed = self.committed_offsets()
        offsets_read = self._clock()
        positions = self.topic_positions(committed)
        first = job = self._job.run(batch, self.layouts, positions, tag, {})
        self.stats.last_job_seconds = job.seconds
        redos = batch_decisions.BatchRedos(tag, positions)
        while (redo := redos.after(job)) is not None:
            self._discard(job)
            for table, changes in redo.schema_changes.items():
                self._evolve(table, changes)
            job = self._job.run(batch, self.layouts, redo.positions, tag, redo.truncate_lsns)
            self.stats.last_job_seconds += job.seconds
        metrics.JOB_SECONDS.labels("driver" if job.in_driver else "spark").observe(self.stats.last_job_seconds)
        result = replace(
            self._finish(tag, committed, first, job, redos.truncated, started),
            offsets_seconds=offsets_read - started,
            job_in_driver=job.in_driver,
        )
        metrics.BATCH_SECONDS.observe(result.seconds)
        self._log(result)
        return result

    def _discard(self, job: JobResult) -> None:
        for table in job.files:
            self.tables[table].delete_files(job.written_paths(table))

    def _evolve(self, table: str, changes: Sequence[ColumnChange]) -> None:
        """Each change its own metadata commit, before the batch's data commit; a crash between
        them leaves the change made, and the batch, done again, finds nothing to change."""
        iceberg = self.tables[table]
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
        self.layouts[table] = batch_decisions.reloaded_layout(self.layouts[table], self._load_layout(table))

    def _finish(
        self,
        tag: str,
        committed: Mapping[str, offset_log.Offsets],
        first: JobResult,
        job: JobResult,
        truncated: Truncates,
        started: float,
    ) -> BatchResult:
        # Offsets and counts come from the first run, which read every new record; the records
        # a redo did not parse again (before a truncate) keep the first run's rejections.
        records = first.records
        self.stats.count_batch(records)
        metrics.BATCHES.inc()
        metrics.RECORDS.inc(records)
        if not records:
            return BatchResult(tag, 0, 0, {}, self._clock() - started)
        self._failpoint("after-files")

        followed: dict[str, list[unavailable.MovedImage]] = {}
        letters = batch_decisions.dead_letters(first, job, truncated) + self._resolve_unavailable(tag, job, truncated, followed)
        if letters:
            self._dead_letters.send(letters)
            self.stats.count_dead_letters(letters)
            for letter in letters:
                metrics.DEAD_LETTERS.labels(letter.reason).inc()
        self._failpoint("after-dead-letters")
        self._count_not_written(job)

        commits_started = self._clock()
        done = self._commit_all(batch_decisions.table_commits(tag, committed, first, job, truncated, letters), job)
        ended = self._clock()
        commits = {table: snapshot for table, snapshot, _ in done}
        self._carry_moves(job, commits, truncated, followed)
        commit_seconds = {table: seconds for table, _, seconds in done}
        return BatchResult(
            tag, records, len(letters), commits, ended - started, commit_seconds, commits_wall_seconds=ended - commits_started
        )

    def _resolve_unavailable(
        self, tag: str, job: JobResult, truncated: Truncates, followed: dict[str, list[unavailable.MovedImage]]
    ) -> list[DeadLetter]:
        """Complete the rows whose unsent (TOAST) values the batch does not hold from their keys'
        earlier versions, read from the table for just those keys; the completed rows join the
        batch as data files of its commit, the rest become dead letters. ``followed`` gets each
        table's key changes whose images the rows took."""
        letters: list[DeadLetter] = []
        for table, rows in job.unresolved.items():
            if not rows:
                continue
            # A key change split by batch boundaries: its old key's image is an earlier batch's.
            moved, layout = self._pending_moves[table].with_batch(job.moved.get(table, [])), self.layouts[table]
            wanted = unavailable.rows_to_read(rows, moved)
            # After a truncate in the batch, the table's rows are gone with it: nothing to read.
            found = {} if table in truncated or not wanted else self._read_rows(table, wanted, rows, moved)
            resolution = unavailable.resolve(rows, moved, found)
            followed[table] = resolution.followed
            if resolution.rows:
                job.files[table].extend(self._job.write_rows(layout, resolution.rows, tag))
            letters += batch_decisions.unresolvable_letters(table, resolution.unresolvable, _unresolvable_detail)
            metrics.UNAVAILABLE_ROWS.labels(table, "resolved").inc(len(resolution.rows))
            metrics.UNAVAILABLE_ROWS.labels(table, "dead-lettered").inc(len(resolution.unresolvable))
            log.info(
                "%s: %d rows took unsent (TOAST) values from the %d rows read from the table; %d had no earlier version "
                "(dead-lettered)",
                table,
                len(resolution.rows),
                len(found),
                len(resolution.unresolvable),
                extra={"table": table},
            )
        return letters

    def _read_rows(
        self,
        table: str,
        wanted: Collection[tuple[Key, unavailable.Version]],
        rows: Sequence[unavailable.UnresolvedRow],
        moved: Sequence[unavailable.MovedImage],
    ) -> dict[tuple[Key, unavailable.Version], dict[str, Any]]:
        """The rows of ``wanted`` keys, one read per table version."""
        columns = unavailable.columns_to_read(rows, moved)
        by_version: dict[unavailable.Version, list[Key]] = defaultdict(list)
        for key, version in wanted:
            by_version[version].append(key)
        found: dict[tuple[Key, unavailable.Version], dict[str, Any]] = {}
        for version, keys in by_version.items():
            read = self.tables[table].key_rows(self.layouts[table].primary_key, keys, columns, version)
            found |= {(key, version): row for key, row in read.items()}
        return found

    def _carry_moves(
        self,
        job: JobResult,
        commits: Mapping[str, CommittedSnapshot],
        truncated: Truncates,
        followed: Mapping[str, Sequence[unavailable.MovedImage]],
    ) -> None:
        """Keep the batch's key changes for creates of later batches, with the table as the batch
        found it (its commit's parent); a truncate leaves nothing to take values from."""
        for table in set(self._pending_moves) | set(job.moved):
            if table in truncated:
                self._pending_moves.pop(table, None)
                continue
            commit = commits.get(table)
            before = unavailable.NO_SNAPSHOT if commit is None or commit.parent_snapshot_id is None else commit.parent_snapshot_id
            self._pending_moves[table].advance(job.moved.get(table, []), before, followed.get(table, []))

    def _count_not_written(self, job: JobResult) -> None:
        """Fields the tables lack and records that are not changes: counted, and each unknown
        field named once in the log."""
        for table, columns in job.unknown_columns.items():
            for column, count in columns.items():
                metrics.UNKNOWN_COLUMNS.labels(table, column).inc(count)
                if (table, column) not in self._told_unknown:
                    self._told_unknown.add((table, column))
                    log.warning(
                        "%s: the source sends a field %r the table has no column for; its values are not written "
                        "(evolve_schema adds columns from the schema wrapper, infer_new_columns without one)",
                        table,
                        column,
                        extra={"table": table},
                    )
        for table, kinds in job.skipped.items():
            for kind, count in kinds.items():
                metrics.SKIPPED.labels(table, kind).inc(count)
        self.stats.count_skipped(job.skipped)

    def _commit_all(self, commits: Sequence[TableCommit], job: JobResult) -> list[tuple[str, CommittedSnapshot, float]]:
        def commit(planned: TableCommit) -> tuple[str, CommittedSnapshot, float]:
            snapshot, seconds = self._commit(planned, job)
            self._failpoint("after-commit")
            return planned.table, snapshot, seconds

        if len(commits) > 1:
            # Each table's commit is its own (its offsets ride in it), so they need no order; a
            # commit is mostly waiting on files and the catalog, so a batch spanning many tables
            # commits them side by side. Every commit ends before an error of one is raised.
            futures = [self._commit_pool.submit(commit, planned) for planned in commits]
            wait(futures)
            return [future.result() for future in futures]
        return [commit(planned) for planned in commits]

    def _commit(self, planned: TableCommit, job: JobResult) -> tuple[CommittedSnapshot, float]:
        """One table's commit of the batch, and how long it took; called on several threads at
        once for different tables (what they share is updated under ``_bookkeeping``)."""
        name, table, layout = planned.table, self.tables[planned.table], self.layouts[planned.table]
        commit_started = self._clock()
        if planned.truncate:
            table.delete_files(planned.discarded)
            snapshot = table.commit_truncate(planned.what, planned.data, planned.summary)
            metrics.TRUNCATES.labels(name).inc()
            log.info("%s: truncated by the source (batch %s)", name, planned.batch_id, extra={"table": name})
        else:
            try:
                snapshot = table.commit_files(planned.what, planned.data, planned.deletes, planned.summary)
            except MissingPartitionSpec as missing:
                # The unpartitioned spec of the global deletes was expired with the metadata that
                # no live file used any more: add it again and name it in this batch's files.
                spec_id = table.ensure_unpartitioned_spec()
                self.layouts[name] = replace(layout, global_spec_id=spec_id)
                deletes = [batch_decisions.with_spec_id(d, missing.spec_id, spec_id) for d in planned.deletes]
                snapshot = table.commit_files(planned.what, planned.data, deletes, planned.summary)
        seconds = self._clock() - commit_started
        global_deletes = planned.rows(FileKind.GLOBAL_DELETE)
        with self._bookkeeping:
            self.stats.count_commit(planned, snapshot, seconds)
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
                self.rules[name].before_image.value,
                extra={"table": name},
            )
        event = batch_decisions.commit_event(planned, snapshot, layout, job.unknown_columns.get(name, {}))
        with self._bookkeeping:  # the publisher keeps undelivered events to send again
            self._events.publish(event)
        return snapshot, seconds

    def _log(self, result: BatchResult) -> None:
        if not result.records:
            log.info("batch %s: nothing new (already committed)", result.batch_id)
            return
        if not result.commits:
            log.info(
                "batch %s: %d records, %d dead letters -> no commit in %.2fs",
                result.batch_id,
                result.records,
                result.dead_letters,
                result.seconds,
                extra={"batch_id": result.batch_id, "records": result.records},
            )
        for table, snapshot in result.commits.items():
            log.info(
                "batch %s: %d records, %d dead letters -> %s snapshot %d seq %d in %.2fs (write job %.2fs%s, commit %.2fs)",
                result.batch_id,
                result.records,
                result.dead_letters,
                table,
                snapshot.snapshot_id,
                snapshot.sequence_number,
                result.seconds,
                self.stats.last_job_seconds,
                " in the driver" if result.job_in_driver else "",
                result.commit_seconds[table],
                extra={
                    "batch_id": result.batch_id,
                    "records": result.records,
                    "table": table,
                    "snapshot_id": snapshot.snapshot_id,
                    "sequence_number": snapshot.sequence_number,
                },
            )


def _unresolvable_detail(row: unavailable.UnresolvedRow) -> str:
    why = "the row has no earlier version to take them from (neither in the batch nor in the table)"
    return unavailable_detail(row.key, row.image.unresolved, why)


class BatchWriter:
    """Writes micro-batches of Kafka records (Spark Kafka source schema) into the configured
    tables: a ``BatchRunner`` over the tables in Iceberg, the batch's Spark job and Kafka. Its
    construction reads the tables' layouts from the catalog and adds the unpartitioned spec that
    global deletes need where a table lacks it."""

    def __init__(
        self,
        spark: SparkSession,
        config: Config,
        dead_letter_producer: Producer,
        publisher: CommitEventPublisher,
        source_name: str = "kafka",
        retry: CatalogRetry | None = None,
    ) -> None:
        self.spark = spark
        self.config = config
        self._retry = retry
        names = [table.name for table in config.tables]
        layouts = self._load_layouts(names, "table {ref} does not exist (icecdc creates it when its config has a schema)")
        bridge = JavaBridge(spark)
        _ = bridge.updates  # compiled now (0.4 s once per JVM), not in the first batch's commit
        if local_warehouse(config.catalog.properties):
            write_local_files_in_process(bridge)
        self.tables = {name: IcebergTable(bridge, config.table_ref(name), retry) for name in names}
        rules = {table.name: table.source_rules for table in config.tables}
        for name, layout in layouts.items():
            if batch_decisions.may_delete_globally(layout, rules[name]) and layout.global_spec_id is None:
                layouts[name] = replace(layout, global_spec_id=self.tables[name].ensure_unpartitioned_spec())
        cores = spark.sparkContext.defaultParallelism
        spread = batch_decisions.WriteSpread.for_source(config.ingest.max_batch_records, len(names), cores)
        self.job = BatchJob(
            rules,
            config.catalog.properties,
            spread,
            parse_tasks=2 * cores,
            driver_batch_records=config.ingest.driver_batch_records,
        )
        self.batches = BatchRunner(
            tables=self.tables,
            layouts=layouts,
            rules=rules,
            job=self.job,
            dead_letters=DeadLetterTopic(dead_letter_producer, config.dead_letter_topic),
            events=publisher,
            load_layout=self._reload_layout,
            commit_pool=ThreadPoolExecutor(config.ingest.commit_threads, thread_name_prefix="icecdc-commit"),
            source_name=source_name,
        )

    def _load_layouts(self, names: Sequence[str], missing: str) -> dict[str, TableLayout]:
        """The tables' layouts as the catalog has them now; ``missing`` says why one is not there."""
        catalog = metadata_call(self._retry, "opening the catalog", lambda: pyiceberg_catalog(self.config))
        layouts = {}
        for name in names:
            ref, table = self.config.table_ref(name), self.config.table(name)
            metadata = metadata_call(self._retry, f"loading {ref}", functools.partial(load_metadata_table, catalog, ref))
            if metadata is None:
                raise NoSuchTable(missing.format(ref=ref))
            layouts[name] = layout_from_pyiceberg(name, table.topic, table.primary_key, metadata)
        return layouts

    def _reload_layout(self, name: str) -> TableLayout:
        return self._load_layouts([name], "table {ref} disappeared while its schema was changed")[name]

    @property
    def stats(self) -> IngestStats:
        return self.batches.stats

    @property
    def layouts(self) -> dict[str, TableLayout]:
        return self.batches.layouts

    def committed_offsets(self) -> dict[str, offset_log.Offsets]:
        return self.batches.committed_offsets()

    def topic_positions(self, committed: Mapping[str, offset_log.Offsets]) -> dict[Position, int]:
        return self.batches.topic_positions(committed)

    @property
    def prefixes(self) -> SchemaPrefixes:
        """The wrapper prefixes the batches cut from records (the direct reader cuts them too)."""
        return self.batches.prefixes

    def __call__(self, batch: BatchInput, batch_id: int | str) -> BatchResult:
        """The ``foreachBatch`` entry point (a DataFrame), and the direct reader's (its records)."""
        return self.batches.run(batch, batch_id)
