"""Each writer that is not ours as one job with one shape, for the tests and ``icecdc bench
writers``: it loads its table, writes a number of commits in the background at its trigger
interval, and ends with its commits, its refusals and how its table differs from its model."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import SparkSession

from icecdc.testbed.upsert_sink import ChangeGenerator as SinkChanges
from icecdc.testbed.upsert_sink import UpsertSink, create_table
from icecdc.testbed.writers.append import AppendWriter
from icecdc.testbed.writers.merge import MergeWriter, WriteMode
from icecdc.testbed.writers.model import Batch, BatchKind, ChangeGenerator, Locality, diff
from icecdc.testbed.writers.streaming import StreamingWriter


class Writer(enum.Enum):
    """The writers of the issue's list: (a) merge-on-read, (b) copy-on-write, (c) appends, (d)
    a Flink-style upsert sink."""

    MERGE_ON_READ = "merge-on-read"
    COPY_ON_WRITE = "copy-on-write"
    APPENDS = "appends"
    UPSERT_SINK = "upsert-sink"


@dataclass(frozen=True)
class JobSettings:
    format_version: int = 2
    trigger_seconds: float = 2.0
    changes: int = 40  # a commit's changes
    load_rows: int = 300  # the first commit's inserts
    locality: Locality | None = None  # None: every commit touches every partition
    files_per_commit: int = 4  # the append writer's files a partition and commit
    # A refusal is counted, and the job goes on as a job with a retry loop would.
    retry: bool = True
    # Each statement scans the newest snapshot (REFRESH TABLE), for a sidecar committing in the
    # writer's own process; a writer in its own process keeps Spark's catalog cache, as users' do.
    refresh: bool = False
    margin_seconds: float = 300.0  # a busy machine runs a statement slower than its trigger
    seed: int = 64


@dataclass(frozen=True)
class JobEnd:
    commits: int
    refused: list[str]  # each refused commit, with Iceberg's error
    retries: int
    differences: list[str]  # the table against the model of the writer's changes; empty: exact
    rows: int  # in the model


class WriterJob(Protocol):
    @property
    def commits(self) -> int: ...

    def begin(self) -> None:
        """Create and load the table: two commits, the second one a commit of the writer's kind."""

    def write(self, commits: int) -> None:
        """Start ``commits`` more commits in the background, one a trigger interval."""

    def wait(self) -> None:
        """Until every commit asked for is made (bounded by the trigger and the margin)."""

    def end(self) -> JobEnd: ...


class StreamingJob:
    """A ``foreachBatch`` writer fed batch by batch: its query commits one batch a trigger."""

    def __init__(self, writer: StreamingWriter, batch: Callable[[ChangeGenerator], Batch], settings: JobSettings) -> None:
        self.writer, self._batch, self._settings = writer, batch, settings
        self.changes = ChangeGenerator(seed=settings.seed, locality=settings.locality)
        self._asked = 0

    @property
    def commits(self) -> int:
        return self.writer.commits

    def begin(self) -> None:
        self.writer.start()
        kind = BatchKind.APPEND if isinstance(self.writer, AppendWriter) else BatchKind.MERGE
        self.writer.feed([self.changes.inserts(self._settings.load_rows, kind), self._batch(self.changes)])
        self._asked = 2
        self.writer.wait_for_commits(self._asked)

    def write(self, commits: int) -> None:
        self.writer.feed([self._batch(self.changes) for _ in range(commits)])
        self._asked += commits

    def wait(self) -> None:
        self.writer.wait_for_commits(self._asked)

    def end(self) -> JobEnd:
        self.writer.stop()
        expected = self.writer.expected()
        refused = [f"batch {r.seq}, attempt {r.attempt}: {r.error}" for r in self.writer.refused]
        return JobEnd(self.writer.commits, refused, self.writer.retries, diff(expected, self.writer.read_rows()), len(expected))


class SinkJob:
    """The Flink-style upsert sink, one checkpoint a trigger interval."""

    def __init__(self, sink: UpsertSink, settings: JobSettings) -> None:
        self.sink, self._settings = sink, settings
        self._asked = 0

    @property
    def commits(self) -> int:
        return self.sink.commits

    def begin(self) -> None:
        self.sink.commit_checkpoint(self._settings.load_rows)
        self.sink.commit_checkpoint()
        self._asked = 2

    def write(self, commits: int) -> None:
        self.sink.start(commits, self._settings.trigger_seconds)
        self._asked += commits

    def wait(self) -> None:
        missing = self._asked - self.sink.commits
        self.sink.wait_for_commits(self._asked, self._settings.trigger_seconds * missing + self._settings.margin_seconds)
        self.sink.stop()

    def end(self) -> JobEnd:
        self.sink.stop()
        return JobEnd(
            self.sink.commits, list(self.sink.refused), len(self.sink.refused), self.sink.table_diff(), len(self.sink.model)
        )


def writer_job(writer: Writer, spark: SparkSession, table: str, work_dir: Path, settings: JobSettings) -> WriterJob:
    """The job of ``writer`` on ``table`` (created by the job; its folders under ``work_dir``)."""
    if writer is Writer.UPSERT_SINK:
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {table.rsplit('.', 1)[0]}")
        create_table(spark, table, settings.format_version)
        # Flink's sink in Iceberg 1.10.2 writes no deletion vectors: on v3 it changes a key at most
        # once a checkpoint, the only way it commits there at all.
        twice = 0.0 if settings.format_version >= 3 else 0.15
        changes = SinkChanges(settings.seed, twice=twice, locality=settings.locality)
        return SinkJob(UpsertSink(spark, table, changes_per_checkpoint=settings.changes, generator=changes), settings)
    options: dict[str, Any] = {
        "format_version": settings.format_version,
        "trigger_seconds": settings.trigger_seconds,
        "retry": settings.retry,
        "refresh": settings.refresh,
        "margin_seconds": settings.margin_seconds,
    }
    if writer is Writer.APPENDS:
        append = AppendWriter(spark, table, work_dir, files_per_commit=settings.files_per_commit, **options)
        return StreamingJob(append, lambda c: c.inserts(settings.changes, BatchKind.APPEND), settings)
    mode = WriteMode.MERGE_ON_READ if writer is Writer.MERGE_ON_READ else WriteMode.COPY_ON_WRITE
    return StreamingJob(MergeWriter(spark, table, work_dir, mode=mode, **options), lambda c: c.merge(settings.changes), settings)
