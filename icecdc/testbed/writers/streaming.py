"""The part every foreign writer shares: a real Structured Streaming query over a folder of
Parquet files (one file per batch, one file per trigger), whose ``foreachBatch`` runs the
writer's statement, records each refused commit and retries it if asked."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from icecdc.testbed.writers.gate import Gate
from icecdc.testbed.writers.model import COLUMNS, DDL_COLUMNS, Batch, Row, TableModel, diff

# The stream's files: the batch's place in the feed and statement, then the MERGE source's columns.
FIELDS = (
    ("seq", LongType(), pa.int64()),
    ("kind", StringType(), pa.string()),
    ("op", StringType(), pa.string()),
    ("id", LongType(), pa.int64()),
    ("region", StringType(), pa.string()),
    ("amount", LongType(), pa.int64()),
    ("status", StringType(), pa.string()),
    ("updated_at", TimestampType(), pa.timestamp("us", tz="UTC")),
)
STREAM_SCHEMA = StructType([StructField(name, spark_type) for name, spark_type, _ in FIELDS])
ARROW_SCHEMA = pa.schema([(name, arrow_type) for name, _, arrow_type in FIELDS])
# What Iceberg raises when it refuses a commit (a failed validation, or retries used up).
REFUSALS = ("ValidationException", "CommitFailedException")


@dataclass(frozen=True)
class Refusal:
    seq: int  # the batch whose commit was refused
    attempt: int  # 1 for the first try of that batch
    error: str  # Iceberg's exception and message


def refusal_of(error: BaseException) -> str | None:
    """Iceberg's line in the error (py4j's first line only names the call), or None."""
    return next((line.strip() for line in str(error).splitlines() if any(name in line for name in REFUSALS)), None)


class StreamingWriter:
    """Subclasses give the table's properties and the statement one batch runs."""

    properties: Mapping[str, str] = {}

    def __init__(
        self,
        spark: SparkSession,
        table: str,
        work_dir: Path,
        *,
        format_version: int = 2,
        trigger_seconds: float = 2.0,
        retry: bool = False,
        max_attempts: int = 5,
        margin_seconds: float = 120.0,
        gate: Gate | None = None,
        refresh: bool = False,
    ) -> None:
        self.spark = spark
        self.table = table
        self.format_version = format_version
        self.trigger_seconds = trigger_seconds
        self.retry = retry
        self.max_attempts = max_attempts
        self.margin_seconds = margin_seconds
        self.gate = gate
        # Spark's catalog cache lets a statement scan a snapshot older than another process's
        # commits (as a user's job does by default); ``refresh`` scans the newest one instead.
        self.refresh = refresh
        self.inbox = work_dir / "inbox"
        self.checkpoint = work_dir / "checkpoint"
        self.batches: dict[int, Batch] = {}
        self.committed: list[int] = []  # the seq of each committed batch, in commit order
        self.refused: list[Refusal] = []
        self.retries = 0
        self.query: StreamingQuery | None = None
        self._changed = threading.Condition()
        self._fed_at = time.time_ns()

    # -- the table ---------------------------------------------------------------------------
    def create_table(self) -> None:
        namespace = self.table.rsplit(".", 1)[0]
        props = {"format-version": str(self.format_version), **self.properties}
        listed = ", ".join(f"'{key}'='{value}'" for key, value in props.items())
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
        self.spark.sql(
            f"CREATE TABLE {self.table} ({DDL_COLUMNS}) USING iceberg PARTITIONED BY (region) TBLPROPERTIES ({listed})"
        )

    # -- the stream --------------------------------------------------------------------------
    def start(self) -> StreamingWriter:
        """Create the table if it is missing and start the query (it waits for ``feed``)."""
        if not self.spark.catalog.tableExists(self.table):
            self.create_table()
        self.inbox.mkdir(parents=True, exist_ok=True)
        stream = self.spark.readStream.schema(STREAM_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(self.inbox))
        self.query = (
            stream.writeStream.foreachBatch(self._on_batch)
            .trigger(processingTime=f"{self.trigger_seconds} seconds")
            .option("checkpointLocation", str(self.checkpoint))
            .start()
        )
        return self

    def feed(self, batches: Iterable[Batch]) -> None:
        """Write one Parquet file per batch; the query takes them in ``seq`` order, one per trigger."""
        for batch in batches:
            if not batch.changes:
                raise ValueError(f"batch {batch.seq} is empty: the file source would run no micro-batch for it")
            self.batches[batch.seq] = batch
            rows = [
                dict(zip(ARROW_SCHEMA.names, (batch.seq, batch.kind.value, change.op.value, *change.row.values()), strict=True))
                for change in batch.changes
            ]
            table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
            name = f"batch-{batch.seq:06d}.parquet"
            # A name with "_" is invisible to the file source until the rename makes it whole.
            pq.write_table(table, self.inbox / f"_{name}")
            os.replace(self.inbox / f"_{name}", self.inbox / name)
            # The file source orders files by modification time: make it follow seq.
            stamp = self._fed_at + batch.seq * 1_000_000
            os.utime(self.inbox / name, ns=(stamp, stamp))

    def _on_batch(self, frame: DataFrame, batch_id: int) -> None:
        first = frame.select("seq").first()
        if first is None:
            return
        batch = self.batches[first["seq"]]
        session = frame.sparkSession
        source = frame.drop("seq", "kind")
        if self.gate is not None:
            source = source.select(*[self.gate.column(c) if c == "id" else c for c in source.columns])
        view = "batch_" + self.table.replace(".", "_")
        source.createOrReplaceTempView(view)
        for attempt in range(1, self.max_attempts + 1):
            try:
                if self.refresh:
                    session.sql(f"REFRESH TABLE {self.table}")
                self.run(session, view, batch)
                break
            except Exception as error:
                refusal = refusal_of(error)
                if refusal is None:
                    raise
                with self._changed:
                    self.refused.append(Refusal(batch.seq, attempt, refusal))
                    self._changed.notify_all()
                if not self.retry or attempt == self.max_attempts:
                    raise
                self.retries += 1
        with self._changed:
            self.committed.append(batch.seq)
            self._changed.notify_all()

    def run(self, session: SparkSession, view: str, batch: Batch) -> None:
        """Run the batch's statement; ``view`` holds the micro-batch without ``seq`` and ``kind``."""
        raise NotImplementedError

    @property
    def commits(self) -> int:
        return len(self.committed)

    def wait_for_commits(self, count: int) -> None:
        """Wait until ``count`` batches committed in all, for at most one trigger interval per
        missing commit plus the margin; raise if the query stopped or the time ran out."""
        deadline = time.monotonic() + self.trigger_seconds * max(count - self.commits, 0) + self.margin_seconds
        with self._changed:
            while self.commits < count:
                if self.query is not None and not self.query.isActive:
                    raise RuntimeError(f"{self.table}: the query stopped after {self.commits} commits: {self.query.exception()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.table}: {self.commits} of {count} commits; refused: {self.refused}")
                self._changed.wait(min(left, 0.5))

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()

    def __enter__(self) -> StreamingWriter:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the check ---------------------------------------------------------------------------
    def expected(self) -> dict[int, Row]:
        """The model's rows after every committed batch."""
        return TableModel.replay(self.batches[seq] for seq in self.committed).rows

    def read_rows(self, spark: SparkSession | None = None) -> list[Row]:
        session = spark or self.spark
        # Each session caches the table; the stream's session committed, so refresh this one.
        session.sql(f"REFRESH TABLE {self.table}")
        selected = ", ".join(c if c != "updated_at" else "unix_micros(updated_at) AS updated_at" for c in COLUMNS)
        return [Row(*r) for r in session.sql(f"SELECT {selected} FROM {self.table}").collect()]

    def assert_matches(self, spark: SparkSession | None = None) -> None:
        """The table holds exactly the model's rows (a diff of at most a few lines if not)."""
        expected = self.expected()
        lines = diff(expected, self.read_rows(spark))
        assert not lines, f"{self.table} differs from its model ({len(expected)} rows expected):\n" + "\n".join(lines)
