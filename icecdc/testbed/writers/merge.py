"""Writers (a) and (b): a ``foreachBatch`` query that runs ``MERGE INTO`` the table from each
micro-batch, or a set-based ``UPDATE`` / ``DELETE``, in merge-on-read or copy-on-write mode."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from icecdc.testbed.writers.model import Batch, BatchKind
from icecdc.testbed.writers.streaming import StreamingWriter

MERGE = """
MERGE INTO {table} t USING {view} s ON t.id = s.id
WHEN MATCHED AND s.op = 'd' THEN DELETE
WHEN MATCHED THEN UPDATE SET *
WHEN NOT MATCHED AND s.op <> 'd' THEN INSERT *
"""


class WriteMode(enum.Enum):
    MERGE_ON_READ = "merge-on-read"  # (a): position deletes on v2, deletion vectors on v3
    COPY_ON_WRITE = "copy-on-write"  # (b): rewrites every data file it changes


def mode_properties(mode: WriteMode) -> dict[str, str]:
    return {f"write.{command}.mode": mode.value for command in ("delete", "update", "merge")}


class MergeWriter(StreamingWriter):
    def __init__(
        self, spark: SparkSession, table: str, work_dir: Path, *, mode: WriteMode = WriteMode.MERGE_ON_READ, **options: Any
    ) -> None:
        """``options``: those of ``StreamingWriter`` (format version, trigger, retry, gate)."""
        super().__init__(spark, table, work_dir, **options)
        self.mode = mode

    @property
    def properties(self) -> Mapping[str, str]:  # type: ignore[override]
        return mode_properties(self.mode)

    def run(self, session: SparkSession, view: str, batch: Batch) -> None:
        if batch.kind is BatchKind.MERGE:
            session.sql(MERGE.format(table=self.table, view=view))
            return
        if not batch.changes:
            return
        keys = ", ".join(str(key) for key in batch.keys)
        if batch.kind is BatchKind.UPDATE:
            row = batch.changes[0].row
            session.sql(
                f"UPDATE {self.table} SET status = '{row.status}', updated_at = timestamp_micros({row.updated_at}) "
                f"WHERE id IN ({keys})"
            )
        elif batch.kind is BatchKind.DELETE:
            session.sql(f"DELETE FROM {self.table} WHERE id IN ({keys})")
        else:
            raise ValueError(f"a merge writer runs no {batch.kind.value} batch")
