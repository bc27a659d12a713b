"""The micro-batch writer: a ``foreachBatch(df, batch_id)`` function that any Structured Streaming
query over Kafka-shaped rows can call, and that the direct Kafka source calls too.

Order of work in one batch, and why:
1. read each table's committed offsets from its snapshot history (exactly-once filter);
2. parse, reduce and write files on the executors (Spark stages in ``stages``);
3. send rejected records to the dead-letter topic and wait for delivery (before the commit, so
   a crash can at worst send a dead letter twice, never lose one);
4. per table, one RowDelta commit with the files and the advanced offsets (never two batches in
   one commit: their equality deletes must not share a sequence number with older data);
5. publish a commit event per commit.
A crash anywhere before 4 leaves only unreferenced files (orphans); after 4 the table's offsets
make the replay a no-op.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from icecdc import failpoints, summary
from icecdc.catalog import load_metadata_table, metadata_call, pyiceberg_catalog
from icecdc.config import Config
from icecdc.errors import MissingPartitionSpec, NoSuchTable
from icecdc.events import CommitEvent, PartitionDelta
from icecdc.ingest import metrics
from icecdc.ingest import offsets as offset_log
from icecdc.ingest.evolution import ChangeKind, ColumnChange
from icecdc.ingest.job import BatchJob, JobResult, Position, WrittenFile
from icecdc.ingest.publish import (
    CommitEventPublisher,
    dead_letters_from_rows,
    send_dead_letters,
)
from icecdc.ingest.stages import DATA, DELETE, GLOBAL_DELETE
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import CommittedSnapshot, IcebergTable
from icecdc.layout import TableLayout, layout_from_pyiceberg
from icecdc.outages import CatalogRetry
from icecdc.sourcespec import UnknownPartition

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# A write task reduces and writes this many records at most; a batch of up to this size is
# written by one task, so it adds one file per touched partition and kind.
ROWS_PER_WRITE_TASK = 200_000
# A batch is done again at most this many times as its tables change under it (a schema change
# or a truncate each ask for one redo).
MAX_REDOS = 4


@dataclass
class IngestStats:
    """Running totals, for progress lines and metrics."""

    batches: int = 0
    batches_skipped: int = 0
    records: int = 0
    dead_letters: int = 0
    dead_letters_by_reason: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    commits: int = 0
    data_records: int = 0
    delete_records: int = 0
    last_commit_seconds: float = 0.0
    # Commits by others (the compactor) that landed during one of ours and cost it a retry.
    interleaved_commits: int = 0
    last_job_seconds: float = 0.0  # the Spark job: parse, shuffle, reduce, write files
    skipped: Counter[str] = field(default_factory=Counter)  # records that are not row changes, by kind


@dataclass(frozen=True)
class BatchResult:
    batch_id: str
    records: int
    dead_letters: int
    commits: dict[str, CommittedSnapshot]
    seconds: float
    # table -> how long its Iceberg commit took (the writer's commit latency, per table).
    commit_seconds: dict[str, float] = field(default_factory=dict)


def _partition_deltas(layout: TableLayout, files: list[WrittenFile]) -> list[PartitionDelta]:
    by_partition: dict[tuple[Any, ...], dict[str, int]] = {}
    for f in files:
        if f.kind == GLOBAL_DELETE:
            continue  # in no partition: the event counts them apart
        counts = by_partition.setdefault(f.partition, defaultdict(int))
        prefix = "data" if f.kind == DATA else "equality_delete"
        counts[f"{prefix}_files"] += 1
        counts[f"{prefix}_records"] += f.record_count
        if f.kind == DATA:
            counts["data_bytes"] += f.file_size
    return [
        PartitionDelta(layout.partition_record(p), layout.partition_path(p), layout.spec_id, **counts)
        for p, counts in by_partition.items()
    ]


def _before_truncate(row: Mapping[str, Any], truncated: Mapping[str, Mapping[Position, int]]) -> bool:
    """Whether a record came before its table's truncate in this batch (a redo skips it)."""
    at = truncated.get(row.get("table") or "", {}).get((row["topic"], row["kafka_partition"]))
    return at is not None and row["offset"] <= at


def _with_spec_id(description: str, old: int, new: int) -> str:
    document = orjson.loads(description)
    if document.get("spec-id") == old:
        document["spec-id"] = new
    return orjson.dumps(document).decode()


class BatchWriter:
    """Writes micro-batches of Kafka records (Spark Kafka source schema) into the configured tables."""

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
        self.source_name = source_name
        self.stats = IngestStats()
        self._dead_letter_producer = dead_letter_producer
        self._publisher = publisher
        catalog = metadata_call(retry, "opening the catalog", lambda: pyiceberg_catalog(config))
        self.layouts: dict[str, TableLayout] = {}
        for table in config.tables:
            ref = config.table_ref(table)
            metadata = metadata_call(retry, f"loading {ref}", functools.partial(load_metadata_table, catalog, ref))
            if metadata is None:
                raise NoSuchTable(f"table {ref} does not exist (icecdc creates it when its config has a schema)")
            self.layouts[table.name] = layout_from_pyiceberg(table.name, table.topic, table.primary_key, metadata)
        bridge = JavaBridge(spark)
        self.tables = {name: IcebergTable(bridge, config.table_ref(name), retry) for name in self.layouts}
        self.rules = {table.name: table.source_rules for table in config.tables}
        self._told_global: set[str] = set()  # tables whose first global deletes were explained in the log
        for name, layout in self.layouts.items():
            if self._may_delete_globally(name) and layout.global_spec_id is None:
                self.layouts[name] = dataclasses.replace(layout, global_spec_id=self.tables[name].ensure_unpartitioned_spec())
        self._retry = retry
        self._told_unknown: set[tuple[str, str]] = set()  # (table, field) named in the log already
        # Sized from the largest batch the source can deliver, since the job cannot count its
        # input before it runs: one write task (one file per partition and kind) for up to
        # ROWS_PER_WRITE_TASK records.
        write_tasks = max(1, -(-config.ingest.max_batch_records // ROWS_PER_WRITE_TASK))
        self._job = BatchJob(self.rules, config.catalog.properties, write_tasks)
        self._bookkeeping = threading.Lock()
        self._commit_pool = ThreadPoolExecutor(config.ingest.commit_threads, thread_name_prefix="icecdc-commit")

    def _may_delete_globally(self, table: str) -> bool:
        layout = self.layouts[table]
        unknown = self.rules[table].unknown_partition is UnknownPartition.GLOBAL_DELETE
        return unknown and bool(layout.partition) and not layout.key_determines_partition

    def committed_offsets(self) -> dict[str, offset_log.Offsets]:
        """table -> its committed offsets, read from the table (the source of truth)."""
        return {name: offset_log.committed_offsets(table.summaries_newest_first()) for name, table in self.tables.items()}

    def topic_positions(self, committed: Mapping[str, offset_log.Offsets]) -> dict[tuple[str, int], int]:
        """(topic, partition) -> next offset to read, each topic as committed by its own table."""
        return {
            (self.layouts[table].topic, partition): offset
            for table, topics in committed.items()
            for partition, offset in topics.get(self.layouts[table].topic, {}).items()
        }

    def __call__(self, df: DataFrame, batch_id: int | str) -> BatchResult:
        """The ``foreachBatch`` entry point."""
        started = time.monotonic()
        tag = f"{self.source_name}:{batch_id}"
        committed = self.committed_offsets()
        positions = self.topic_positions(committed)
        first = job = self._job.run(df, self.layouts, positions, tag)
        self.stats.last_job_seconds = job.seconds
        truncated: dict[str, dict[Position, int]] = {}
        # A batch whose records ask for new columns, or hold a truncate, is done again once the
        # tables are ready for it (rare: a schema change, a truncate): its files are discarded.
        for _ in range(MAX_REDOS):
            new_truncates = {t: p for t, p in job.truncates.items() if t not in truncated}
            if not job.schema_changes and not new_truncates:
                break
            self._discard(job)
            for table, changes in job.schema_changes.items():
                self._evolve(table, changes)
            truncated.update(new_truncates)
            redo_positions = dict(positions)
            for at in truncated.values():  # what precedes a truncate is emptied with the table
                redo_positions.update({position: offset + 1 for position, offset in at.items()})
            job = self._job.run(df, self.layouts, redo_positions, tag)
            self.stats.last_job_seconds += job.seconds
        else:
            raise RuntimeError(f"batch {tag}: the tables kept changing under it ({MAX_REDOS} attempts)")
        result = self._finish(tag, committed, first, job, truncated, started)
        metrics.BATCH_SECONDS.observe(result.seconds)
        self._log(result)
        return result

    def _discard(self, job: JobResult) -> None:
        for table in job.files:
            self.tables[table].delete_files(job.written_paths(table))

    def _evolve(self, table: str, changes: list[ColumnChange]) -> None:
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
            failpoints.hit("after-schema-change")
        catalog = metadata_call(self._retry, "opening the catalog", lambda: pyiceberg_catalog(self.config))
        metadata = metadata_call(
            self._retry, f"loading {iceberg.ref}", functools.partial(load_metadata_table, catalog, iceberg.ref)
        )
        if metadata is None:
            raise NoSuchTable(f"table {iceberg.ref} disappeared while its schema was changed")
        table_config = self.config.table(table)
        layout = layout_from_pyiceberg(table, table_config.topic, table_config.primary_key, metadata)
        self.layouts[table] = dataclasses.replace(
            layout, global_spec_id=layout.global_spec_id or self.layouts[table].global_spec_id
        )

    def _finish(
        self,
        tag: str,
        committed: Mapping[str, offset_log.Offsets],
        first: JobResult,
        job: JobResult,
        truncated: Mapping[str, Mapping[Position, int]],
        started: float,
    ) -> BatchResult:
        # Offsets and counts come from the first run, which read every new record; the records
        # a redo did not parse again (before a truncate) keep the first run's rejections.
        records = first.records
        self.stats.batches += 1
        self.stats.records += records
        metrics.BATCHES.inc()
        metrics.RECORDS.inc(records)
        if not records:
            self.stats.batches_skipped += 1
            return BatchResult(tag, 0, 0, {}, time.monotonic() - started)
        failpoints.hit("after-files")

        rejected = job.rejected if job is first else job.rejected + [r for r in first.rejected if _before_truncate(r, truncated)]
        letters = dead_letters_from_rows(rejected)
        if letters:
            send_dead_letters(self._dead_letter_producer, self.config.dead_letter_topic, letters)
            self.stats.dead_letters += len(letters)
            for letter in letters:
                self.stats.dead_letters_by_reason[letter.reason] += 1
                metrics.DEAD_LETTERS.labels(letter.reason).inc()
        failpoints.hit("after-dead-letters")
        self._count_not_written(job)

        rejected_tables = {letter.table for letter in letters}

        def commit(table: str) -> tuple[str, CommittedSnapshot, float]:
            offsets = offset_log.advance(committed.get(table, {}), first.consumed[table])
            snapshot, seconds = self._commit(table, job.files.get(table, []), offsets, tag, truncate=table in truncated, job=job)
            failpoints.hit("after-commit")
            return table, snapshot, seconds

        # A batch of tombstones only is not worth a snapshot: replaying it changes nothing.
        tables = [t for t in first.consumed if job.files.get(t) or t in rejected_tables or t in truncated]
        if len(tables) > 1:
            # Each table's commit is its own (its offsets ride in it), so they need no order; a
            # commit is mostly waiting on files and the catalog, so a batch spanning many tables
            # commits them side by side. Every commit ends before an error of one is raised.
            futures = [self._commit_pool.submit(commit, table) for table in tables]
            wait(futures)
            done = [future.result() for future in futures]
        else:
            done = [commit(t) for t in tables]
        commits = {table: snapshot for table, snapshot, _ in done}
        commit_seconds = {table: seconds for table, _, seconds in done}
        return BatchResult(tag, records, len(letters), commits, time.monotonic() - started, commit_seconds)

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
                self.stats.skipped[kind] += count

    def _commit(
        self, table: str, files: list[WrittenFile], offsets: offset_log.Offsets, tag: str, truncate: bool, job: JobResult
    ) -> tuple[CommittedSnapshot, float]:
        """One table's commit of the batch, and how long it took; called on several threads at
        once for different tables (what they share is updated under ``_bookkeeping``)."""
        layout = self.layouts[table]
        commit_started = time.monotonic()
        data = [f.description for f in files if f.kind == DATA]
        deletes = [f.description for f in files if f.kind != DATA]
        what, tags = f"committing batch {tag} to {table}", offset_log.batch_summary(offsets, tag)
        if truncate:
            # After a truncate the batch's own rows are all there is: its delete files have
            # nothing to apply to.
            self.tables[table].delete_files([f.path for f in files if f.kind != DATA])
            files = [f for f in files if f.kind == DATA]
            snapshot = self.tables[table].commit_truncate(f"{what} (a truncate)", data, tags)
            metrics.TRUNCATES.labels(table).inc()
            log.info("%s: truncated by the source (batch %s)", table, tag, extra={"table": table})
        else:
            try:
                snapshot = self.tables[table].commit_files(what, data, deletes, tags)
            except MissingPartitionSpec as missing:
                # The unpartitioned spec of the global deletes was expired with the metadata that
                # no live file used any more: add it again and name it in this batch's files.
                spec_id = self.tables[table].ensure_unpartitioned_spec()
                self.layouts[table] = dataclasses.replace(layout, global_spec_id=spec_id)
                deletes = [_with_spec_id(d, missing.spec_id, spec_id) for d in deletes]
                snapshot = self.tables[table].commit_files(what, data, deletes, tags)
        seconds = time.monotonic() - commit_started
        rows = {kind: sum(f.record_count for f in files if f.kind == kind) for kind in (DATA, DELETE, GLOBAL_DELETE)}
        global_files = sum(f.kind == GLOBAL_DELETE for f in files)
        with self._bookkeeping:
            self.stats.last_commit_seconds = seconds
            self.stats.commits += 1
            self.stats.interleaved_commits += snapshot.interleaved
            self.stats.data_records += rows[DATA]
            self.stats.delete_records += rows[DELETE] + rows[GLOBAL_DELETE]
            explain_global = bool(global_files) and table not in self._told_global
            if explain_global:
                self._told_global.add(table)
        metrics.COMMITS.labels(table).inc()
        metrics.COMMIT_SECONDS.labels(table).observe(seconds)
        metrics.COMMIT_INTERLEAVED.labels(table).inc(snapshot.interleaved)
        metrics.ROWS_WRITTEN.labels(table, "data").inc(rows[DATA])
        metrics.ROWS_WRITTEN.labels(table, "equality-delete").inc(rows[DELETE])
        metrics.ROWS_WRITTEN.labels(table, "global-equality-delete").inc(rows[GLOBAL_DELETE])
        if explain_global:
            log.info(
                "%s: %d keys whose old partition is unknown (before_image: %s) were deleted in every partition; the "
                "compactor resolves such global deletes. A source that sends the whole old row (MySQL's default, "
                "PostgreSQL with REPLICA IDENTITY FULL) needs none: set before_image: full (docs/ingest.md)",
                table,
                rows[GLOBAL_DELETE],
                self.rules[table].before_image.value,
                extra={"table": table},
            )
        event = CommitEvent(
            table=table,
            snapshot_id=snapshot.snapshot_id,
            parent_snapshot_id=snapshot.parent_snapshot_id,
            sequence_number=snapshot.sequence_number,
            commit_time_ms=snapshot.timestamp_ms,
            operation=snapshot.operation,
            writer=summary.INGEST_WRITER,
            batch_id=tag,
            source_offsets={t: {str(p): o for p, o in parts.items()} for t, parts in offsets.items()},
            partitions=_partition_deltas(layout, files),
            global_delete_files=global_files,
            global_delete_records=rows[GLOBAL_DELETE],
            truncated=truncate,
            unknown_columns=dict(job.unknown_columns.get(table, {})),
        )
        with self._bookkeeping:  # the publisher keeps undelivered events to send again
            self._publisher.publish(event)
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
                "batch %s: %d records, %d dead letters -> %s snapshot %d seq %d in %.2fs (write job %.2fs, commit %.2fs)",
                result.batch_id,
                result.records,
                result.dead_letters,
                table,
                snapshot.snapshot_id,
                snapshot.sequence_number,
                result.seconds,
                self.stats.last_job_seconds,
                result.commit_seconds[table],
                extra={
                    "batch_id": result.batch_id,
                    "records": result.records,
                    "table": table,
                    "snapshot_id": snapshot.snapshot_id,
                    "sequence_number": snapshot.sequence_number,
                },
            )
