"""The micro-batch writer: a ``foreachBatch(df, batch_id)`` function that any Structured Streaming
query over Kafka-shaped rows can call, and that the direct Kafka source calls too. ``BatchRunner``
keeps the order of a batch's steps over protocols, ``batch_decisions`` decides, and ``BatchWriter``
wires it to Iceberg, Spark and Kafka. It decides nothing itself.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from icecdc.domain import summary as summary_keys
from icecdc.domain.errors import NoSuchTable
from icecdc.domain.layout import TableLayout, layout_from_pyiceberg
from icecdc.domain.sourcespec import SourceRules
from icecdc.ingest import batch_decisions, metrics
from icecdc.ingest import offsets as offset_log
from icecdc.ingest.batch_decisions import DeadLetter, IngestStats, JobResult, Position
from icecdc.ingest.commit_fanout import CommitEvents, CommitFanOut, CommittingTable
from icecdc.ingest.job import BatchInput, BatchJob
from icecdc.ingest.prefixes import SchemaPrefixes
from icecdc.ingest.publish import CommitEventPublisher, DeadLetterTopic
from icecdc.ingest.redo import EvolvingTable, JobRuns, RedoLoop, RunningJob
from icecdc.ingest.toast import KeyedTable, RowWriter, ToastResolver
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import CommittedSnapshot, IcebergTable, write_local_files_in_process
from icecdc.runtime import failpoints
from icecdc.runtime.catalog import (
    load_metadata_table,
    local_warehouse,
    metadata_call,
    older_spec_data_live,
    pyiceberg_catalog,
)
from icecdc.runtime.config import Config
from icecdc.runtime.outages import CatalogRetry

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class Table(EvolvingTable, KeyedTable, CommittingTable, Protocol):
    """What a batch reads from and commits to one table (``jvm.tables.IcebergTable``)."""

    def summaries_back_to(self, key: str) -> Sequence[Mapping[str, str]]: ...


class Job(RunningJob, RowWriter, Protocol):
    """A batch's job, in the driver or on Spark (``job.BatchJob``)."""

    @property
    def prefixes(self) -> SchemaPrefixes: ...


class DeadLetters(Protocol):
    """The dead-letter topic: ``send`` returns once every letter is delivered, or raises."""

    def send(self, letters: Iterable[DeadLetter]) -> int: ...


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


@dataclass(frozen=True)
class BatchTiming:
    """A written batch as an observer of the direct reader sees it (``run_direct``'s ``observe``)."""

    polled_at: float  # epoch seconds: when the poll returned the batch
    result: BatchResult

    @property
    def commits_started_at(self) -> float:
        """Epoch seconds: when the batch's commits began, after its job, dead letters and TOAST."""
        return self.polled_at + self.result.seconds - self.result.commits_wall_seconds


class BatchRunner:
    """Runs micro-batches through the tables, job, dead-letter topic and commit events it is
    given; ``load_layout`` reads a table's layout again after a schema change. A batch's steps:

    1. read each table's committed offsets from its snapshot history (exactly-once filter);
    2. parse, reduce and write files (``stages``), on Spark's executors, or in the driver for a
       small batch the direct reader holds there (``job``); run the job again after a schema
       change or a truncate (``redo``);
    3. complete rows with unsent (TOAST) values from the table (``toast``);
    4. send rejected records to the dead-letter topic and wait for delivery (before the commit,
       so a crash can at worst send a dead letter twice, never lose one);
    5. per table, one RowDelta commit with the files and the advanced offsets, then its commit
       event (``commit_fanout``). Two batches never share a commit: their equality deletes must
       not share a sequence number with older data.

    A crash before 5 leaves only unreferenced files (orphans); after 5 the table's offsets make
    the replay a no-op."""

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
        self.layouts = dict(layouts)  # shared with the steps below: a schema change updates it in place
        self.rules = dict(rules)
        self.source_name = source_name
        self.stats = IngestStats()
        self._job = job
        self._dead_letters = dead_letters
        self._commit_pool = commit_pool
        self._failpoint = failpoint
        self._clock = clock
        self._told_unknown: set[tuple[str, str]] = set()  # (table, field) named in the log already
        self._redos = RedoLoop(
            tables=self.tables, layouts=self.layouts, job=job, load_layout=load_layout, stats=self.stats, failpoint=failpoint
        )
        self._toast = ToastResolver(tables=self.tables, layouts=self.layouts, writer=job)
        self._commits = CommitFanOut(
            tables=self.tables,
            layouts=self.layouts,
            rules=self.rules,
            events=events,
            pool=commit_pool,
            stats=self.stats,
            failpoint=failpoint,
            clock=clock,
        )

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
        """One batch, in the order of the class's docstring."""
        started = self._clock()
        tag = f"{self.source_name}:{batch_id}"
        committed = self.committed_offsets()
        offsets_read = self._clock()
        runs = self._redos.run(batch, self.topic_positions(committed), tag)
        result = replace(
            self._finish(tag, committed, runs, started),
            offsets_seconds=offsets_read - started,
            job_in_driver=runs.last.in_driver,
        )
        metrics.BATCH_SECONDS.observe(result.seconds)
        log_batch(result, self.stats.last_job_seconds)
        return result

    def _finish(self, tag: str, committed: Mapping[str, offset_log.Offsets], runs: JobRuns, started: float) -> BatchResult:
        """The batch after its job: dead letters, then the commits, then the key changes kept."""
        # Offsets and counts come from the first run, which read every new record; the records
        # a redo did not parse again (before a truncate) keep the first run's rejections.
        records = runs.first.records
        self._count_batch(records)
        if not records:
            return BatchResult(tag, 0, 0, {}, self._clock() - started)
        self._failpoint("after-files")

        rejected = batch_decisions.dead_letters(runs.first, runs.last, runs.truncated)
        resolved = self._toast.resolve(tag, runs.last, runs.truncated)
        letters = rejected + resolved.letters
        self._send_dead_letters(letters)
        self._failpoint("after-dead-letters")
        self._count_not_written(runs.last)

        commits_started = self._clock()
        planned = batch_decisions.table_commits(tag, committed, runs.first, runs.last, runs.truncated, letters)
        done = self._commits.commit_all(planned, runs.last)
        ended = self._clock()
        commits = {c.table: c.snapshot for c in done}
        self._toast.carry_moves(runs.last, commits, runs.truncated, resolved.followed)
        commit_seconds = {c.table: c.seconds for c in done}
        return BatchResult(
            tag, records, len(letters), commits, ended - started, commit_seconds, commits_wall_seconds=ended - commits_started
        )

    def _count_batch(self, records: int) -> None:
        self.stats.count_batch(records)
        metrics.BATCHES.inc()
        metrics.RECORDS.inc(records)

    def _send_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        """Delivered before any commit, so a crash can at worst send a dead letter twice."""
        if not letters:
            return
        self._dead_letters.send(letters)
        self.stats.count_dead_letters(letters)
        for letter in letters:
            metrics.DEAD_LETTERS.labels(letter.reason).inc()

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


def log_batch(result: BatchResult, job_seconds: float) -> None:
    """One line per committed table, or one saying why nothing committed."""
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
            job_seconds,
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
        names = [table.name for table in config.ingested_tables]
        layouts = self._load_layouts(names, "table {ref} does not exist (icecdc creates it when its config has a schema)")
        bridge = JavaBridge(spark)
        _ = bridge.updates  # compiled now, once per JVM, so the first batch's commit does not wait for it
        if local_warehouse(config.catalog.properties):
            write_local_files_in_process(bridge)
        self.tables = {name: IcebergTable(bridge, config.table_ref(name), retry) for name in names}
        rules = {table.name: table.source_rules for table in config.ingested_tables}
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
            layout = layout_from_pyiceberg(name, table.source_topic, table.primary_key, metadata)
            older = not layout.append_only and metadata_call(
                self._retry, f"listing {ref}'s manifests", functools.partial(older_spec_data_live, metadata)
            )
            if older:
                log.warning(
                    "%s holds data files of an older partition spec: the ingester writes its deletes as "
                    "global deletes until the sidecar has rewritten them into the current spec and the "
                    'ingester restarts (docs/compactor.md, "Older partition specs")',
                    name,
                    extra={"table": name},
                )
            layouts[name] = replace(layout, older_spec_data=older)
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
