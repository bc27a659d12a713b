"""Committing a batch's files to one Iceberg table through the Java API (Spark has no way to
commit equality deletes): one ``RowDelta`` with data and delete files, no conflict validation
(as Flink's writer does), the source offsets in its summary.

No validation is what keeps the writer from ever failing because of a concurrent compaction: the
compaction's rewrite carries the older sequence number, so this batch's equality deletes still
apply to the rewritten files, and Iceberg's own commit retry re-applies the RowDelta on top of
whatever the compactor committed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icecdc.ingest.layout import PartitionKey, TableLayout
from icecdc.jvm import CommittedSnapshot, commit_tagged, history, jvm, load_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

@dataclass(frozen=True)
class WrittenFile:
    kind: str  # "data" or "delete"
    path: str
    partition: PartitionKey
    record_count: int
    file_size: int
    description: str  # Iceberg's content-file JSON, made where the file was written (filemeta.py)


def java_partition(spark: SparkSession, spec: Any, layout: TableLayout, partition: PartitionKey,
                   cache: dict[PartitionKey, Any] | None = None) -> Any:
    """The Java partition tuple (``StructLike``) of a canonical partition."""
    # Iceberg's public parser from partition strings to a typed partition tuple is
    # DataFiles.Builder.withPartitionValues; borrowing it avoids py4j's int-vs-long ambiguity
    # (a Python int becomes a Java Integer, which a long partition field rejects).
    if cache is not None and partition in cache:
        return cache[partition]
    iceberg = jvm(spark).org.apache.iceberg
    result = (
        iceberg.DataFiles.builder(spec)
        .withPartitionValues(layout.partition_java_strings(partition))
        .withPath("partition-parser").withFormat(iceberg.FileFormat.PARQUET)
        .withFileSizeInBytes(0).withRecordCount(0).build().partition()
    )
    if cache is not None:
        cache[partition] = result
    return result


class TableCommitter:
    """The Java table of one configured table, and the commits the ingester makes to it."""

    def __init__(self, spark: SparkSession, qualified_name: str, layout: TableLayout) -> None:
        self._spark = spark
        self._jvm = jvm(spark)
        self.layout = layout
        self.table = load_table(spark, qualified_name)

    def summaries_newest_first(self) -> Iterator[Mapping[str, str]]:
        self.table.refresh()
        return (dict(snapshot.summary()) for snapshot in history(self.table))

    def commit(self, files: Sequence[WrittenFile], summary: Mapping[str, str]) -> CommittedSnapshot:
        table = self.table
        spec = table.specs().get(self.layout.spec_id)
        iceberg = self._jvm.org.apache.iceberg
        mapper = iceberg.util.JsonUtil.mapper()
        delta = table.newRowDelta()
        for file in files:
            # The file's description comes from the executor that wrote it: no footer is re-read.
            java_file = iceberg.ContentFileParser.fromJson(mapper.readTree(file.description), spec)
            delta = delta.addRows(java_file) if file.kind == "data" else delta.addDeletes(java_file)
        return commit_tagged(delta, summary, self.table)
