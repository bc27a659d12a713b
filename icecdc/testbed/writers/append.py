"""Writer (c): inserts only, many small files per commit, as Iceberg's Kafka Connect sink writes
(each of its tasks adds a file per partition to every commit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from icecdc.testbed.writers.model import COLUMNS, Batch, BatchKind
from icecdc.testbed.writers.streaming import StreamingWriter


class AppendWriter(StreamingWriter):
    def __init__(self, spark: SparkSession, table: str, work_dir: Path, *, files_per_commit: int = 8, **options: Any) -> None:
        """``options``: those of ``StreamingWriter`` (format version, trigger, retry, gate)."""
        super().__init__(spark, table, work_dir, **options)
        self.files_per_commit = files_per_commit

    def run(self, session: SparkSession, view: str, batch: Batch) -> None:
        if batch.kind is not BatchKind.APPEND:
            raise ValueError(f"the append writer runs no {batch.kind.value} batch")
        # No shuffle by partition and one open file per partition in each task: n tasks, n files.
        (
            session.table(view)
            .select(*COLUMNS)
            .repartition(self.files_per_commit)
            .writeTo(self.table)
            .option("distribution-mode", "none")
            .option("fanout-enabled", "true")
            .append()
        )
