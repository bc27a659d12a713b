"""The three executor-side stages of a micro-batch, as ``mapInArrow`` functions over Arrow
record batches: parse Kafka records, reduce each key to what the batch commits, write one
Parquet file per (table, partition, kind). Only the rows describing written files (and rejected
records) ever reach the driver.

Rows travel between stages with JSON payloads (orjson), so one plan serves tables of any schema.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Iterator, Mapping
from itertools import groupby
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from icecdc.ingest.batch import KeyChange, reduce_key, to_key_change
from icecdc.ingest.debezium import Reason, RejectedEvent, parse_change
from icecdc.ingest.layout import TableLayout

# What Spark's Kafka source yields (the foreachBatch writer's input contract).
KAFKA_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
                "timestamp timestamp, timestampType int")
PARSED_SCHEMA = ("table string, topic string, kafka_partition int, offset long, key string, op string, "
                 "change binary, reason string, detail string, raw_key binary, raw_value binary")
REDUCED_SCHEMA = "table string, kind string, partition string, row binary"
FILES_SCHEMA = "table string, kind string, path string, partition string, record_count long, file_size long"

DATA, DELETE = "data", "delete"
SKIP = "skip"  # tombstones: they advance offsets and nothing else

ArrowStage = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _parsed_arrow_schema() -> pa.Schema:
    return pa.schema([
        ("table", pa.string()), ("topic", pa.string()), ("kafka_partition", pa.int32()), ("offset", pa.int64()),
        ("key", pa.string()), ("op", pa.string()), ("change", pa.binary()), ("reason", pa.string()),
        ("detail", pa.string()), ("raw_key", pa.binary()), ("raw_value", pa.binary()),
    ])


def parse_stage(layouts_by_topic: Mapping[str, TableLayout], committed: Mapping[tuple[str, int], int]) -> ArrowStage:
    """Kafka records -> one parsed row each. Records below the table's committed offset (a
    replayed batch, or the replayed part of one) are dropped here: that is the exactly-once filter."""
    schema = _parsed_arrow_schema()

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out: list[dict[str, Any]] = []
            for record in batch.to_pylist():
                topic, partition, offset = record["topic"], record["partition"], record["offset"]
                if offset < committed.get((topic, partition), 0):
                    continue
                row: dict[str, Any] = {"topic": topic, "kafka_partition": partition, "offset": offset}
                layout = layouts_by_topic.get(topic)
                try:
                    if layout is None:
                        raise RejectedEvent(Reason.UNKNOWN_TABLE, f"topic {topic!r} is not mapped to a table in the configuration")
                    row["table"] = layout.table
                    if record["value"] is None:
                        row["op"] = SKIP
                    else:
                        event = parse_change(record["key"], record["value"], layout.columns, layout.primary_key)
                        change = to_key_change(event, layout)
                        row.update(op=event.op, key=orjson.dumps(list(event.key)).decode(),
                                   change=orjson.dumps({"after": change.after, "prior": change.prior_partitions}))
                except RejectedEvent as rejected:
                    row.update(reason=rejected.rejection.reason, detail=rejected.rejection.detail,
                               raw_key=record["key"], raw_value=record["value"])
                out.append(row)
            yield pa.RecordBatch.from_pylist(out, schema=schema)

    return parse


def reduce_stage(layouts_by_table: Mapping[str, TableLayout]) -> ArrowStage:
    """Rows grouped by (table, key), in source order -> one data row per surviving key and one
    delete row per partition where an earlier version may live."""
    schema = pa.schema([("table", pa.string()), ("kind", pa.string()), ("partition", pa.string()), ("row", pa.binary())])

    def reduce(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = (r for batch in batches for r in batch.to_pylist())
        for (table, key), group in groupby(rows, key=lambda r: (r["table"], r["key"])):
            layout = layouts_by_table[table]
            changes = []
            for r in group:
                change = orjson.loads(r["change"])
                changes.append(KeyChange(r["op"], change["after"], tuple(tuple(p) for p in change["prior"])))
            result = reduce_key(changes)
            out: list[dict[str, Any]] = []
            if result.row is not None:
                out.append({"table": table, "kind": DATA, "partition": orjson.dumps(layout.partition_of(result.row)).decode(),
                            "row": orjson.dumps(result.row)})
            key_row = orjson.dumps(dict(zip(layout.primary_key, orjson.loads(key))))
            out.extend({"table": table, "kind": DELETE, "partition": orjson.dumps(p).decode(), "row": key_row}
                       for p in sorted(result.delete_partitions, key=repr))
            yield pa.RecordBatch.from_pylist(out, schema=schema)

    return reduce


def write_parquet(table: pa.Table, path: str, io_properties: Mapping[str, str]) -> int:
    """Write through pyiceberg's FileIO (so object stores and their credentials work from the same
    catalog properties the JVM uses); returns the file size."""
    from pyiceberg.io import load_file_io

    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    data = buffer.getvalue()
    with load_file_io(dict(io_properties), path).new_output(path).create(overwrite=False) as stream:
        stream.write(data)
    return len(data)


def write_stage(layouts_by_table: Mapping[str, TableLayout], io_properties: Mapping[str, str], batch_tag: str) -> ArrowStage:
    """Rows grouped by (table, partition, kind) -> one Parquet file each, with Iceberg field ids.
    File names are unique per attempt, so a retried or replayed batch never overwrites a file a
    committed snapshot references; files of attempts that never commit are orphans."""
    schema = pa.schema([("table", pa.string()), ("kind", pa.string()), ("path", pa.string()),
                        ("partition", pa.string()), ("record_count", pa.int64()), ("file_size", pa.int64())])

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = (r for batch in batches for r in batch.to_pylist())
        for (table, partition, kind), group in groupby(rows, key=lambda r: (r["table"], r["partition"], r["kind"])):
            layout = layouts_by_table[table]
            records = [orjson.loads(r["row"]) for r in group]
            arrow = layout.to_arrow(records, key_only=kind == DELETE)
            partition_path = layout.partition_path(tuple(orjson.loads(partition)))
            name = f"{batch_tag}-{uuid.uuid4().hex}-{kind}.parquet"
            path = "/".join(p for p in (layout.data_location, partition_path, name) if p)
            size = write_parquet(arrow, path, io_properties)
            yield pa.RecordBatch.from_pylist([{
                "table": table, "kind": kind, "path": path, "partition": partition,
                "record_count": arrow.num_rows, "file_size": size,
            }], schema=schema)

    return write
