"""The demo's second writer: a plain Spark Structured Streaming job, as a team would already run
one, whose ``foreachBatch`` runs ``MERGE INTO`` a merge-on-read table. It knows nothing of
icecdc: the sidecar keeps its table by name alone and finds its commits in the catalog.

The job reads a folder with one small Parquet file per batch (one file per trigger), keeps its
own model of the rows its batches imply (key -> row), and counts the commits Iceberg refuses,
retrying each a few times as a job with a retry loop would."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

COLUMNS = ("id", "region", "amount", "status")
DDL_COLUMNS = "id BIGINT, region STRING, amount BIGINT, status STRING"
# Merge-on-read for every row-level command: deletes land as position deletes against older files.
PROPERTIES = {"format-version": "2", **{f"write.{command}.mode": "merge-on-read" for command in ("delete", "update", "merge")}}
REGIONS = ("eu", "us", "apac")
STATUSES = ("new", "active", "suspended", "closed")
MERGE = """
MERGE INTO {table} t USING {view} s ON t.id = s.id
WHEN MATCHED AND s.op = 'd' THEN DELETE
WHEN MATCHED THEN UPDATE SET t.region = s.region, t.amount = s.amount, t.status = s.status
WHEN NOT MATCHED AND s.op <> 'd' THEN INSERT (id, region, amount, status) VALUES (s.id, s.region, s.amount, s.status)
"""
# What Iceberg raises when it refuses a commit (a failed validation, or its retries used up).
REFUSALS = ("ValidationException", "CommitFailedException")

Row = tuple[int, str, int, str]


@dataclass(frozen=True)
class Change:
    op: str  # "c", "u" or "d", as Debezium names them
    row: Row  # a delete carries the row it removes


def refusal_of(error: BaseException) -> str | None:
    """Iceberg's line in the error (py4j's first line only names the call), or None."""
    return next((line.strip() for line in str(error).splitlines() if any(name in line for name in REFUSALS)), None)


class ChangeBatches:
    """Seeded batches of inserts, updates (some moving the row to another region) and deletes,
    over a model of every batch made, so that updates and deletes name keys that exist."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.rows: dict[int, Row] = {}
        self.next_key = 1

    def _row(self, key: int, region: str | None = None) -> Row:
        return (key, region or self.random.choice(REGIONS), self.random.randint(10, 10_000), self.random.choice(STATUSES))

    def batch(self, size: int) -> list[Change]:
        changes: list[Change] = []
        existing = self.random.sample(sorted(self.rows), min(len(self.rows), size))
        for _ in range(size):
            roll = self.random.random()
            if not existing or roll < 0.3:
                key, self.next_key = self.next_key, self.next_key + 1
                changes.append(Change("c", self._row(key)))
                continue
            key = existing.pop()
            if roll < 0.45:
                changes.append(Change("d", self.rows[key]))
            elif roll < 0.65:
                moved = self.random.choice([r for r in REGIONS if r != self.rows[key][1]])
                changes.append(Change("u", self._row(key, moved)))
            else:
                changes.append(Change("u", self._row(key, self.rows[key][1])))
        for change in changes:
            if change.op == "d":
                self.rows.pop(change.row[0])
            else:
                self.rows[change.row[0]] = change.row
        return changes


def apply(rows: dict[int, Row], changes: list[Change]) -> None:
    for change in changes:
        if change.op == "d":
            rows.pop(change.row[0], None)
        else:
            rows[change.row[0]] = change.row


class ForeachBatchMergeJob:
    """One streaming query over ``work_dir/inbox``; ``feed`` writes its batches, ``wait`` waits
    for them, ``rows``/``expected`` are the table's rows and the model's."""

    def __init__(
        self,
        spark: SparkSession,
        table: str,
        work_dir: Path,
        *,
        batches: int = 14,
        changes: tuple[int, int] = (20, 50),
        seed: int = 7,
        trigger_seconds: float = 2.0,
        max_attempts: int = 5,
    ) -> None:
        self.spark = spark
        self.table = table
        self.work_dir = work_dir
        self.inbox = work_dir / "inbox"
        self.trigger_seconds = trigger_seconds
        self.max_attempts = max_attempts
        generator = ChangeBatches(seed)
        # The first batch only inserts, so that every region has rows the next ones change.
        self.batches = [generator.batch(changes[1])] + [
            generator.batch(generator.random.randint(*changes)) for _ in range(batches - 1)
        ]
        self.committed: list[int] = []  # the seq of each committed batch, in commit order
        self.refused: list[str] = []  # Iceberg's line, for each refused attempt
        self.query: StreamingQuery | None = None
        self._changed = threading.Condition()

    def start(self) -> ForeachBatchMergeJob:
        """Create the table afresh, start the query and write every batch's file."""
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        namespace = self.table.rsplit(".", 1)[0]
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
        # The demo's catalog outlives its broker; its checkpoint and table start again each run.
        self.spark.sql(f"DROP TABLE IF EXISTS {self.table} PURGE")
        shutil.rmtree(self.work_dir, ignore_errors=True)
        listed = ", ".join(f"'{key}'='{value}'" for key, value in PROPERTIES.items())
        self.spark.sql(
            f"CREATE TABLE {self.table} ({DDL_COLUMNS}) USING iceberg PARTITIONED BY (region) TBLPROPERTIES ({listed})"
        )
        self.inbox.mkdir(parents=True)
        longs = {"seq", "id", "amount"}
        schema = StructType([StructField(c, LongType() if c in longs else StringType()) for c in ("seq", "op", *COLUMNS)])
        self._feed()
        stream = self.spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(self.inbox))
        self.query = (
            stream.writeStream.foreachBatch(self._on_batch)
            .trigger(processingTime=f"{self.trigger_seconds} seconds")
            .option("checkpointLocation", str(self.work_dir / "checkpoint"))
            .queryName("demo-merge-job")
            .start()
        )
        return self

    def _feed(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        base = time.time_ns()
        for seq, changes in enumerate(self.batches):
            rows = [{"seq": seq, "op": c.op, **dict(zip(COLUMNS, c.row, strict=True))} for c in changes]
            name = f"batch-{seq:04d}.parquet"
            # A name with "_" is invisible to the file source until the rename makes it whole.
            pq.write_table(pa.Table.from_pylist(rows), self.inbox / f"_{name}")
            os.replace(self.inbox / f"_{name}", self.inbox / name)
            # The file source takes files in modification-time order: make it follow seq.
            stamp = base + seq * 1_000_000
            os.utime(self.inbox / name, ns=(stamp, stamp))

    def _on_batch(self, frame: DataFrame, batch_id: int) -> None:
        first = frame.select("seq").first()
        if first is None:
            return
        session = frame.sparkSession
        frame.drop("seq").createOrReplaceTempView("demo_merge_job_batch")
        for attempt in range(1, self.max_attempts + 1):
            try:
                if attempt > 1:
                    # A retry scans the table as it is now, as the job's next trigger would.
                    session.sql(f"REFRESH TABLE {self.table}")
                session.sql(MERGE.format(table=self.table, view="demo_merge_job_batch"))
                break
            except Exception as error:
                refusal = refusal_of(error)
                if refusal is None:
                    raise
                with self._changed:
                    self.refused.append(refusal)
                if attempt == self.max_attempts:
                    raise
                time.sleep(attempt)
        with self._changed:
            self.committed.append(int(first["seq"]))
            self._changed.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait until every batch committed or the query stopped; whether all committed."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.committed) < len(self.batches):
                if self.query is None or not self.query.isActive or time.monotonic() > deadline:
                    return False
                self._changed.wait(0.5)
        return True

    def stop(self) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()

    def error(self) -> Any:
        """Why the query stopped, if it failed."""
        return self.query.exception() if self.query is not None else None

    def expected(self) -> list[Row]:
        """The model's rows after every committed batch, in key order."""
        rows: dict[int, Row] = {}
        for seq in self.committed:
            apply(rows, self.batches[seq])
        return sorted(rows.values())

    def rows(self) -> list[tuple[Any, ...]]:
        # The session caches the table; the sidecar commits through the Java API.
        self.spark.sql(f"REFRESH TABLE {self.table}")
        return sorted(tuple(r) for r in self.spark.table(self.table).select(*COLUMNS).collect())
