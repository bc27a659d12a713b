"""The one job of a micro-batch (parse, group by key, reduce and write files, in ``stages``) and
what it hands the driver, read into plain values (``plan.JobResult``): offset marks, rejected
records, written files, the column changes the records' schemas ask for, the fields the tables
lack, the records that were not row changes, and truncates.

The job runs on Spark's executors, or, for a batch the driver already holds (the direct
reader's) of at most ``ingest.driver_batch_records`` records, in the driver itself: the same
stage functions over the same Arrow batches, without a Spark job's fixed cost (see
docs/ingest.md, "One micro-batch").
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Union

import orjson
import pyarrow as pa

from icecdc.domain.layout import TableLayout
from icecdc.domain.sourcespec import SourceRules
from icecdc.ingest.batch import Image, SourceOffset
from icecdc.ingest.batch_decisions import JobResult, Position, TruncateAt, WriteSpread, WrittenFile
from icecdc.ingest.batch_files import write_file
from icecdc.ingest.evolution import ChangeKind, ColumnChange, merge_changes
from icecdc.ingest.filemeta import FileKind
from icecdc.ingest.prefixes import SchemaPrefixes
from icecdc.ingest.records import PolledRecords
from icecdc.ingest.stage_rows import GROUP_ORDER, PARSED, PARSED_SCHEMA, RESULT_SCHEMA, ArrowStage, Tag
from icecdc.ingest.stages import parse_stage, reduce_and_write_stage
from icecdc.ingest.unavailable import MovedImage, SourceRecord, UnresolvedRow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_FILE_KINDS = frozenset(FileKind)


def _written(fact: Mapping[str, Any]) -> WrittenFile:
    return WrittenFile(
        FileKind(fact["op"]),
        fact["path"],
        tuple(orjson.loads(fact["partition"])),
        fact["record_count"],
        fact["file_size"],
        fact["description"],
    )


def read_result(rows: Iterable[Mapping[str, Any]], seconds: float, in_driver: bool = False) -> JobResult:
    """The job's rows (``stage_rows.RESULT``) as plain values."""
    result = JobResult(seconds, in_driver=in_driver)
    changes: dict[str, list[ColumnChange]] = defaultdict(list)
    for row in rows:
        op, table = row["op"], row["table"]
        if row["reason"] is not None:
            result.rejected.append(dict(row))
        elif op == Tag.MARK:
            result.records += row["records"]
            if table is not None:
                consumed = result.consumed[table]
                position = (row["topic"], row["kafka_partition"])
                consumed[position] = max(row["offset"], consumed.get(position, -1))
        elif op in _FILE_KINDS:
            result.files[table].append(_written(row))
        elif op == Tag.SCHEMA:
            changes[table] += [ColumnChange(ChangeKind(k), c, t) for k, c, t in orjson.loads(row["detail"])]
        elif op == Tag.COLUMNS:
            result.unknown_columns[table].update(orjson.loads(row["detail"]))
        elif op == Tag.CONTROL:
            result.skipped[table].update(orjson.loads(row["detail"]))
        elif op == Tag.TRUNCATE:
            truncates = result.truncates[table]
            position = (row["topic"], row["kafka_partition"])
            if position not in truncates or row["offset"] > truncates[position].offset:
                truncates[position] = TruncateAt(row["offset"], row["lsn"])
        elif op == Tag.UNRESOLVED:
            result.unresolved[table].append(_unresolved(row))
        elif op == Tag.PREFIX:
            result.schema_prefixes[row["topic"]] = bytes(row["raw_value"])
        elif op == Tag.MOVED:
            moved = orjson.loads(row["change"])
            image = _image(moved) if moved["row"] is not None else None
            at = _source_offset(moved["at"])
            result.moved[table].append(MovedImage(tuple(orjson.loads(row["key"]).values()), tuple(moved["to"]), image, at))
    result.schema_changes = {table: merge_changes(c) for table, c in changes.items()}
    return result


# Parse tasks of a job in the driver, on threads: one a core, at most four, since the Python
# between Arrow's calls holds the GIL (docs/BENCHMARKS.md, row "Records a second").
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # not on macOS
DRIVER_PARSE_TASKS = max(1, min(4, _CORES))


def run_in_driver(
    records: Sequence[pa.RecordBatch], parse: ArrowStage, write: ArrowStage, parse_tasks: int = DRIVER_PARSE_TASKS
) -> list[dict[str, Any]]:
    """The job's stages in this process: ``parse_tasks`` parse tasks on threads, each over every
    so many of the record batches, as Spark's parse tasks are (most of a parse runs in Arrow,
    which lets go of the GIL); then one write task, over the parsed rows ordered as it reads
    them (``GROUP_ORDER``), so a touched partition gets one file per kind, as it does from one
    write task on Spark."""
    shares = [list(records[task::parse_tasks]) for task in range(parse_tasks)]
    with ThreadPoolExecutor(parse_tasks, thread_name_prefix="icecdc-parse") as tasks:
        parsed_batches = [batch for out in tasks.map(lambda share: list(parse(share)), shares) for batch in out]
    parsed = pa.Table.from_batches(parsed_batches, schema=PARSED).sort_by([(c, "ascending") for c in GROUP_ORDER])
    return [row for batch in write(parsed.to_batches()) for row in batch.to_pylist()]


def _image(change: dict[str, Any]) -> Image:
    source = change["source"]
    key = tuple(source) if source is not None else None
    return Image(change["row"], frozenset(change["unresolved"]), key, _source_offset(change["moved_at"]))


def _source_offset(value: list[int] | None) -> SourceOffset | None:
    return (value[0], value[1]) if value is not None else None


def _unresolved(row: Mapping[str, Any]) -> UnresolvedRow:
    change = orjson.loads(row["change"])
    raw_key, raw_value = (bytes(v) if v is not None else None for v in (row["raw_key"], row["raw_value"]))
    return UnresolvedRow(
        tuple(orjson.loads(row["key"]).values()),
        _image(change),
        tuple(tuple(p) for p in change["prior"]),
        change["global"],
        SourceRecord(row["topic"], row["kafka_partition"], row["offset"], raw_key, raw_value),
    )


# The job's input: Spark's Kafka source's micro-batch, or the records the direct reader polled.
BatchInput = Union["DataFrame", PolledRecords]


class BatchJob:
    """Runs a batch's job with the current layouts, in the driver or on Spark, and learns from
    each run the wrapper prefix each topic's records carry, for the next runs to cut
    (``prefixes``)."""

    def __init__(
        self,
        rules: Mapping[str, SourceRules],
        io_properties: Mapping[str, str],
        spread: WriteSpread,
        parse_tasks: int,
        driver_batch_records: int = 0,
    ) -> None:
        self._rules = dict(rules)
        self._io_properties = dict(io_properties)
        self._spread = spread
        self._parse_tasks = parse_tasks
        self.driver_batch_records = driver_batch_records  # ``ingest.driver_batch_records``
        self.prefixes = SchemaPrefixes()

    def run(
        self,
        batch: BatchInput,
        layouts: Mapping[str, TableLayout],
        positions: Mapping[Position, int],
        tag: str,
        truncate_lsns: Mapping[str, int],
    ) -> JobResult:
        """Parse the records from ``positions`` on (without a truncated table's changes below its
        truncate's LSN, in ``truncate_lsns``), group by key, reduce and write; the marks and
        rejects of the parse stage pass through the write stage to the driver in the same result."""
        started = time.monotonic()
        by_topic = {layout.topic: layout for layout in layouts.values()}
        parse = parse_stage(by_topic, positions, self._rules, truncate_lsns, prefixes=self.prefixes.known)
        write = reduce_and_write_stage(layouts, self._io_properties, tag.replace(":", "-"))
        rows: list[dict[str, Any]]
        if isinstance(batch, PolledRecords) and len(batch) <= self.driver_batch_records:
            rows, in_driver = run_in_driver(batch.arrow(self.prefixes), parse, write), True
        else:
            df = batch.frame(self.prefixes) if isinstance(batch, PolledRecords) else batch
            rows, in_driver = [row.asDict() for row in self._run_on_spark(df, by_topic, parse, write)], False
        result = read_result(rows, time.monotonic() - started, in_driver)
        self.prefixes.learn(result.schema_prefixes)
        return result

    def _run_on_spark(
        self, df: DataFrame, by_topic: Mapping[str, TableLayout], parse: ArrowStage, write: ArrowStage
    ) -> list[Any]:
        # Each Python task has a fixed cost besides its records (the runner, the function
        # shipped), and a source may hand over many small partitions (one per 10,000 records
        # from the direct reader, one per topic partition from Kafka): no more parse tasks than
        # two per core, which still evens out uneven partitions.
        records = self.prefixes.cut_frame(df, list(by_topic)).coalesce(self._parse_tasks)
        return (
            records.mapInArrow(parse, PARSED_SCHEMA)
            .repartition(self._spread.tasks, *self._spread.columns)
            .sortWithinPartitions(*GROUP_ORDER)
            .mapInArrow(write, RESULT_SCHEMA)
            .collect()
        )

    def write_rows(self, layout: TableLayout, rows: Sequence[dict[str, Any]], tag: str) -> list[WrittenFile]:
        """Data files of ``rows`` (one per partition), written as the write stage writes them."""
        by_partition: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by_partition[layout.partition_of(row)].append(row)
        files = []
        for partition, records in by_partition.items():
            arrow = layout.to_arrow(records)
            fact = write_file(layout, FileKind.DATA, partition, arrow, self._io_properties, tag.replace(":", "-"))
            files.append(_written(fact))
        return files
