"""The one Spark job of a micro-batch (parse, shuffle by key, reduce and write files, in
``stages``) and what it hands the driver, read into plain values: offset marks, rejected
records, written files, the column changes the records' schemas ask for, the fields the tables
lack, the records that were not row changes, and truncates.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from icecdc.ingest.evolution import ChangeKind, ColumnChange, merge_changes
from icecdc.ingest.stages import (
    COLUMNS,
    CONTROL,
    DATA,
    DELETE,
    GLOBAL_DELETE,
    MARK,
    PARSED_SCHEMA,
    RESULT_SCHEMA,
    SCHEMA,
    TRUNCATE,
    parse_stage,
    reduce_and_write_stage,
)
from icecdc.layout import PartitionKey, TableLayout
from icecdc.sourcespec import SourceRules

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

Position = tuple[str, int]  # (topic, Kafka partition)


@dataclass(frozen=True)
class WrittenFile:
    kind: str  # DATA, DELETE (equality deletes on the primary key) or GLOBAL_DELETE (the same, in every partition)
    path: str
    partition: PartitionKey
    record_count: int
    file_size: int
    description: str  # Iceberg's content-file JSON, made where the file was written (filemeta.py)


@dataclass
class JobResult:
    seconds: float = 0.0
    records: int = 0  # records read past the committed offsets
    consumed: dict[str, dict[Position, int]] = field(default_factory=lambda: defaultdict(dict))  # table -> highest offset read
    rejected: list[dict[str, Any]] = field(default_factory=list)  # rows with a reason
    files: dict[str, list[WrittenFile]] = field(default_factory=lambda: defaultdict(list))
    schema_changes: dict[str, list[ColumnChange]] = field(default_factory=dict)
    unknown_columns: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    skipped: dict[str, Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter)
    )  # records that are not changes, by kind
    truncates: dict[str, dict[Position, int]] = field(default_factory=lambda: defaultdict(dict))  # the last truncate per position

    @classmethod
    def from_rows(cls, rows: Iterable[Any], seconds: float) -> JobResult:
        result = cls(seconds)
        changes: dict[str, list[ColumnChange]] = defaultdict(list)
        for row in rows:
            if row.reason is not None:
                result.rejected.append(row.asDict())
            elif row.op == MARK:
                result.records += row.records
                if row.table is not None:
                    consumed = result.consumed[row.table]
                    position = (row.topic, row.kafka_partition)
                    consumed[position] = max(row.offset, consumed.get(position, -1))
            elif row.op in (DATA, DELETE, GLOBAL_DELETE):
                result.files[row.table].append(
                    WrittenFile(
                        row.op, row.path, tuple(orjson.loads(row.partition)), row.record_count, row.file_size, row.description
                    )
                )
            elif row.op == SCHEMA:
                changes[row.table] += [ColumnChange(ChangeKind(k), c, t) for k, c, t in orjson.loads(row.detail)]
            elif row.op == COLUMNS:
                result.unknown_columns[row.table].update(orjson.loads(row.detail))
            elif row.op == CONTROL:
                result.skipped[row.table].update(orjson.loads(row.detail))
            elif row.op == TRUNCATE:
                truncates = result.truncates[row.table]
                position = (row.topic, row.kafka_partition)
                truncates[position] = max(row.offset, truncates.get(position, -1))
        result.schema_changes = {table: merge_changes(c) for table, c in changes.items()}
        return result

    def written_paths(self, table: str | None = None) -> list[str]:
        return [f.path for t, files in self.files.items() if table in (None, t) for f in files]


class BatchJob:
    """Runs a batch's Spark job with the current layouts."""

    def __init__(self, rules: Mapping[str, SourceRules], io_properties: Mapping[str, str], write_tasks: int) -> None:
        self._rules = dict(rules)
        self._io_properties = dict(io_properties)
        self._write_tasks = write_tasks

    def run(self, df: DataFrame, layouts: Mapping[str, TableLayout], positions: Mapping[Position, int], tag: str) -> JobResult:
        """Parse the records from ``positions`` on, shuffle by key, reduce and write; the marks and
        rejects of the parse stage pass through the write stage to the driver in the same result."""
        started = time.monotonic()
        by_topic = {layout.topic: layout for layout in layouts.values()}
        rows = (
            df.mapInArrow(parse_stage(by_topic, positions, self._rules), PARSED_SCHEMA)
            .repartition(self._write_tasks, "table", "key")
            .sortWithinPartitions("table", "key", "kafka_partition", "offset")
            .mapInArrow(reduce_and_write_stage(layouts, self._io_properties, tag.replace(":", "-")), RESULT_SCHEMA)
            .collect()
        )
        return JobResult.from_rows(rows, time.monotonic() - started)
