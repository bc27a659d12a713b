"""The Flink-style upsert sink on the real stack: ``UpsertCheckpointWriter.java``, compiled by
Janino in the Spark session's JVM, writes each checkpoint's files with Iceberg's own writer
classes and commits them; this side plans the checkpoints (``upserts.py``), keeps the model,
counts commits and refusals, and compares the table read through Spark with the model."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pyspark.sql import SparkSession

from icecdc.domain.errors import CommitConflict, CompareAndSetLost
from icecdc.domain.tableref import TableRef
from icecdc.jvm.bridge import JavaBridge, java_errors
from icecdc.testbed.upsert_sink.upserts import ChangeGenerator, apply_changes, counts, plan_checkpoint
from icecdc.testbed.writers.model import COLUMNS, DDL_COLUMNS, Row, diff

JAVA_CLASS = "UpsertCheckpointWriter"
SOURCE = Path(__file__).with_name(f"{JAVA_CLASS}.java")
# Iceberg's refusals of a commit (a failed validation; the catalog's compare-and-set lost more
# often than Iceberg retries it), as opposed to an error of the test itself.
REFUSALS = (CommitConflict, CompareAndSetLost)


def java_writer(bridge: JavaBridge) -> Any:
    """An instance of ``UpsertCheckpointWriter``, compiled on first use in this JVM."""
    return bridge.compiled_once(JAVA_CLASS, SOURCE.read_text(encoding="utf-8"))


def create_table(spark: SparkSession, name: str, format_version: int = 2) -> None:
    """The foreign writers' table (``icecdc.testbed.writers.model``), keyed by ``id`` (its identifier
    field, so required), as a Flink upsert sink writes it."""
    columns = DDL_COLUMNS.replace("id BIGINT", "id BIGINT NOT NULL", 1)
    spark.sql(
        f"CREATE TABLE {name} ({columns}) USING iceberg PARTITIONED BY (region) "
        f"TBLPROPERTIES ('format-version'='{format_version}')"
    )
    spark.sql(f"ALTER TABLE {name} SET IDENTIFIER FIELDS id")


def table_rows(spark: SparkSession, name: str, snapshot_id: int | None = None) -> list[Row]:
    """The table's rows as Spark reads them now, or at a snapshot."""
    spark.sql(f"REFRESH TABLE {name}")
    version = "" if snapshot_id is None else f" VERSION AS OF {snapshot_id}"
    selected = ", ".join(c if c != "updated_at" else "unix_micros(updated_at) AS updated_at" for c in COLUMNS)
    return [Row(*r) for r in spark.sql(f"SELECT {selected} FROM {name}{version}").collect()]


@dataclass(frozen=True)
class Checkpoint:
    """One committed checkpoint: its id, the snapshot it made, what it wrote and the model's
    rows after it (what that snapshot must read)."""

    checkpoint_id: int
    snapshot_id: int
    rows: int
    equality_deletes: int
    position_deletes: int
    model: Mapping[int, Row]


class UpsertSink:
    """Commits checkpoints of seeded random upserts and deletes to ``name`` (a table made by
    ``create_table``), one RowDelta each with no validations, as Flink's upsert sink does.

    A refused commit (an Iceberg exception; none is expected, since the commit validates
    nothing) is recorded in ``refused`` and tried again with the same files, as a restored Flink
    job commits its pending checkpoint again; after ``attempts`` refusals the checkpoint is
    dropped and the model stays as it was. On format v3 a checkpoint with position deletes fails
    ("Must use DVs for position deletes in V3"), as Flink's sink in Iceberg 1.10.2 does."""

    def __init__(
        self,
        spark: SparkSession,
        name: str,
        *,
        seed: int = 64,
        changes_per_checkpoint: int = 40,
        attempts: int = 3,
        generator: ChangeGenerator | None = None,
    ) -> None:
        self.spark = spark
        self.name = name
        self.changes_per_checkpoint = changes_per_checkpoint
        self.attempts = attempts
        self.job_id = uuid.uuid4().hex
        self.operator_id = uuid.uuid4().hex
        self.model: dict[int, Row] = {}
        self.refused: list[str] = []
        self.checkpoints: list[Checkpoint] = []
        self._generator = generator or ChangeGenerator(seed)
        self._checkpoint_id = 0  # Flink's checkpoint ids grow, whether or not a checkpoint commits
        self._bridge = JavaBridge(spark)
        self._java = java_writer(self._bridge)
        self._table: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None  # what stopped the background loop, if anything

    @property
    def commits(self) -> int:
        with self._lock:
            return len(self.checkpoints)

    def _loaded(self) -> Any:
        if self._table is None:
            ref = TableRef.of(*self.name.split(".", 1))
            catalog = self._bridge.java_spark_session.sessionState().catalogManager().catalog(ref.catalog)
            identifier = self._bridge.iceberg.catalog.TableIdentifier.parse(ref.identifier)
            self._table = catalog.icebergCatalog().loadTable(identifier)
        return self._table

    def commit_checkpoint(self, size: int | None = None, before_commit: Callable[[], object] | None = None) -> Checkpoint | None:
        """Write and commit the next checkpoint of ``size`` changes (``changes_per_checkpoint``
        unless given: a large first one loads the table); the checkpoint, or None if it was
        refused ``attempts`` times. ``before_commit`` runs between the files and the commit (a
        test's concurrent commit, at a moment it chooses)."""
        self._bridge.activate_session()
        table = self._loaded()
        changes = self._generator.checkpoint(self.model, size or self.changes_per_checkpoint)
        plan = plan_checkpoint(self.model, changes)
        self._checkpoint_id += 1
        checkpoint_id = self._checkpoint_id
        described = [
            {
                "region": p.region,
                "rows": [[r.id, r.amount, r.status, r.updated_at] for r in p.rows],
                "equality": p.equality_deletes,
                "positions": p.position_deletes,
            }
            for p in plan
        ]
        with java_errors():
            table.refresh()
            files = self._java.write(table, orjson.dumps(described).decode(), f"{self.job_id}-{checkpoint_id}")
        if before_commit is not None:
            before_commit()
        for _ in range(self.attempts):
            try:
                with java_errors():
                    snapshot_id = self._java.commit(table, files, self.job_id, self.operator_id, checkpoint_id)
            except REFUSALS as error:
                with self._lock:
                    self.refused.append(f"checkpoint {checkpoint_id}: {error}")
                continue
            model = apply_changes(self.model, changes)
            done = Checkpoint(checkpoint_id, int(snapshot_id), *counts(plan), model=model)
            with self._lock:
                self.model = model
                self.checkpoints.append(done)
            return done
        return None

    def commit_checkpoints(self, n: int) -> list[Checkpoint | None]:
        return [self.commit_checkpoint() for _ in range(n)]

    def start(self, checkpoints: int, interval_seconds: float) -> None:
        """Commit ``checkpoints`` checkpoints on a thread, one every ``interval_seconds`` (Flink's
        checkpoint interval)."""

        def loop() -> None:
            try:
                for _ in range(checkpoints):
                    started = time.monotonic()
                    self.commit_checkpoint()
                    if self._stop.wait(max(0.0, interval_seconds - (time.monotonic() - started))):
                        return
            except BaseException as error:  # noqa: BLE001 - kept for the test to raise
                self.error = error

        self._thread = threading.Thread(target=loop, name=f"upsert-sink-{self.name}", daemon=True)
        self._thread.start()

    def wait_for_commits(self, n: int, timeout_seconds: float) -> None:
        """Until ``n`` checkpoints are committed; raises what stopped the loop, or on timeout."""
        deadline = time.monotonic() + timeout_seconds
        while self.commits < n and self.error is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.error is not None:
            raise self.error
        if self.commits < n:
            raise TimeoutError(f"{self.commits} of {n} checkpoints committed in {timeout_seconds} s")

    def stop(self, timeout_seconds: float = 60.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_seconds)
        if self.error is not None:
            raise self.error

    def table_diff(self, checkpoint: Checkpoint | None = None) -> list[str]:
        """How the table read through Spark differs from the model (now, or at a checkpoint's
        snapshot): one line each, none when equal."""
        if checkpoint is not None:
            return diff(checkpoint.model, table_rows(self.spark, self.name, checkpoint.snapshot_id))
        with self._lock:
            expected = self.model
        return diff(expected, table_rows(self.spark, self.name))
