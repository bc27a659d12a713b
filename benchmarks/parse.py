"""``python -m benchmarks parse``: the ingester's parse stage alone on one core, its Python path
against its fast path (``ingest.fastparse``) over the same records, for the generator's messages
and the real connector's (with and without PostgreSQL's common types).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from icecdc.bench import out_argument, positive_integers, print_results
from icecdc.bench.harness import progress
from icecdc.bench.report import machine, markdown_table, publish, pyplot
from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.domain.sourcespec import BeforeImage, SourceRules
from icecdc.ingest.records import KAFKA_ARROW_WITH_HEADERS
from icecdc.ingest.stage_rows import Tag
from icecdc.ingest.stages import parse_stage
from icecdc.options import state_dir_argument
from icecdc.workload import OrdersWorkload

say = progress("parse")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
TOPIC = "shop.public.orders"
PATHS = ("python", "fast")
SHAPES = ("generator", "connector", "connector-pg-types")
PG_TYPES = "connector-pg-types"
UPDATES, INSERTS = 0.7, 0.2


# The PostgreSQL types the connector-pg-types shape adds: timestamptz, double precision, bytea.
PG_TYPE_COLUMNS = (Column("created_at", "timestamptz"), Column("weight", "double"), Column("photo", "binary"))


def orders_layout(shape: str = "connector") -> TableLayout:
    columns = (
        Column("id", "long", True),
        Column("region", "string"),
        Column("status", "string"),
        Column("amount", "decimal(12, 2)"),
        Column("updated_at", "timestamp"),
        *(PG_TYPE_COLUMNS if shape == PG_TYPES else ()),
    )
    partition = (
        PartitionTerm("region", "region", "identity", "string", 1000),
        PartitionTerm("updated_at_day", "updated_at", "day", "timestamp", 1001),
    )
    return TableLayout("db.orders", TOPIC, columns, {c.name: i + 1 for i, c in enumerate(columns)}, ("id",), partition, 0, "/w")


def _field(field_name: str, kind: str, optional: bool = True, **more: Any) -> dict[str, Any]:
    return {"type": kind, "optional": optional, **more, "field": field_name}


# The Connect schemas of the PostgreSQL connector 3.6.3 for ``orders`` (decimal.handling.mode
# string, time.precision.mode adaptive: a timestamp column is MicroTimestamp).
ROW_FIELDS = [
    _field("id", "int64", False, default=0),
    _field("region", "string"),
    _field("status", "string"),
    _field("amount", "string"),
    _field("updated_at", "int64", name="io.debezium.time.MicroTimestamp", version=1),
]
SOURCE_FIELDS = [
    _field("version", "string", False),
    _field("connector", "string", False),
    _field("name", "string", False),
    _field("ts_ms", "int64", False),
    _field(
        "snapshot",
        "string",
        name="io.debezium.data.Enum",
        version=1,
        parameters={"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},
        default="false",
    ),
    _field("db", "string", False),
    _field("sequence", "string"),
    _field("ts_us", "int64"),
    _field("ts_ns", "int64"),
    _field("schema", "string", False),
    _field("table", "string", False),
    _field("txId", "int64"),
    _field("lsn", "int64"),
    _field("xmin", "int64"),
]
PG_TYPE_FIELDS = [
    _field("created_at", "string", name="io.debezium.time.ZonedTimestamp", version=1),
    _field("weight", "double"),
    _field("photo", "bytes"),
]


def value_schema(row_fields: list[dict[str, Any]]) -> dict[str, Any]:
    """The connector's value schema for a table of ``row_fields``."""
    return {
        "type": "struct",
        "fields": [
            {"type": "struct", "fields": row_fields, "optional": True, "name": f"{TOPIC}.Value", "field": "before"},
            {"type": "struct", "fields": row_fields, "optional": True, "name": f"{TOPIC}.Value", "field": "after"},
            {
                "type": "struct",
                "fields": SOURCE_FIELDS,
                "optional": False,
                "name": "io.debezium.connector.postgresql.Source",
                "field": "source",
            },
            {
                "type": "struct",
                "fields": [
                    _field("id", "string", False),
                    _field("total_order", "int64", False),
                    _field("data_collection_order", "int64", False),
                ],
                "optional": True,
                "name": "event.block",
                "version": 1,
                "field": "transaction",
            },
            _field("op", "string", False),
            _field("ts_ms", "int64"),
            _field("ts_us", "int64"),
            _field("ts_ns", "int64"),
        ],
        "optional": False,
        "name": f"{TOPIC}.Envelope",
        "version": 2,
    }


VALUE_SCHEMA = value_schema(ROW_FIELDS)
PG_TYPES_VALUE_SCHEMA = value_schema(ROW_FIELDS + PG_TYPE_FIELDS)
KEY_SCHEMA = {"type": "struct", "fields": [_field("id", "int64", False, default=0)], "optional": False, "name": f"{TOPIC}.Key"}


def with_pg_types(image: dict[str, Any] | None) -> dict[str, Any] | None:
    """A generator row image with the connector-pg-types columns, as the connector sends them."""
    if image is None:
        return None
    micros = image["updated_at"] - image["id"] * 7_654_321 % 86_400_000_000  # with a fraction of a second
    created = (EPOCH + dt.timedelta(microseconds=micros)).isoformat().replace("+00:00", "Z")
    photo = base64.b64encode(image["id"].to_bytes(8, "big") * 4).decode()
    return {**image, "created_at": created, "weight": float(image["amount"]) * 0.37, "photo": photo}


def connector_record(
    key: bytes, value: bytes, sequence: int, shape: str = "connector"
) -> tuple[bytes, bytes, list[dict[str, Any]]]:
    """A generator record as the real connector would send it: wrapped, with its source block and
    headers (and the connector-pg-types columns)."""
    payload = orjson.loads(value)
    if shape == PG_TYPES:
        payload |= {"before": with_pg_types(payload["before"]), "after": with_pg_types(payload["after"])}
    stamp = payload["ts_ms"]
    lsn = 24_023_128 + 64 * sequence
    payload["source"] = {
        "version": "3.6.3.Final",
        "connector": "postgresql",
        "name": "shop",
        "ts_ms": stamp,
        "snapshot": "false",
        "db": "shop",
        "sequence": f'["{lsn - 64}","{lsn}"]',
        "ts_us": stamp * 1000,
        "ts_ns": stamp * 1_000_000,
        "schema": "public",
        "table": "orders",
        "txId": 1000 + sequence,
        "lsn": lsn,
        "xmin": None,
    }
    payload |= {"transaction": None, "ts_us": stamp * 1000, "ts_ns": stamp * 1_000_000}
    headers = [
        {"key": f"__debezium.context.{name}", "value": text.encode()}
        for name, text in (("connectorLogicalName", "shop"), ("taskId", "0"), ("connectorName", "postgresql"))
    ]
    wrapped_key = orjson.dumps({"schema": KEY_SCHEMA, "payload": orjson.loads(key)})
    schema = PG_TYPES_VALUE_SCHEMA if shape == PG_TYPES else VALUE_SCHEMA
    return wrapped_key, orjson.dumps({"schema": schema, "payload": payload}), headers


def record_batches(shape: str, changes: int, batch_records: int) -> list[pa.RecordBatch]:
    workload = OrdersWorkload(seed=11)
    workload.load(max(1, changes // 10))
    rows = []
    for offset, change in enumerate(workload.changes(changes, UPDATES, INSERTS)):
        key, value = change.record
        headers: list[dict[str, Any]] | None = None
        if shape != "generator":
            key, value, headers = connector_record(key, value, offset, shape)
        rows.append({"key": key, "value": value, "topic": TOPIC, "partition": 0, "offset": offset, "headers": headers})
    return [
        pa.RecordBatch.from_pylist(rows[i : i + batch_records], schema=KAFKA_ARROW_WITH_HEADERS)
        for i in range(0, len(rows), batch_records)
    ]


@dataclass
class PathCost:
    seconds: list[float] = field(default_factory=list)
    taken: int = 0  # records the fast path took (the rest went the Python way)


@dataclass
class ShapeResult:
    shape: str
    records: int
    value_bytes: int
    paths: dict[str, PathCost] = field(default_factory=dict)

    def records_per_second(self, path: str) -> list[float]:
        return [self.records / s for s in self.paths[path].seconds]

    def mb_per_second(self, path: str) -> list[float]:
        return [self.value_bytes / s / 1e6 for s in self.paths[path].seconds]


@dataclass
class ParseResults:
    machine: str
    changes: int
    repeats: int
    batch_records: int
    shapes: list[ShapeResult] = field(default_factory=list)


def _run_stage(shape: str, batches: Sequence[pa.RecordBatch], fast: bool) -> tuple[float, list[pa.RecordBatch]]:
    rules = {"db.orders": SourceRules(before_image=BeforeImage.FULL)}
    stage = parse_stage({TOPIC: orders_layout(shape)}, {}, rules, {}, fast=fast)
    started = time.perf_counter()
    out = list(stage(batches))
    return time.perf_counter() - started, out


def _changes(out: Sequence[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    rows = [r for b in out for r in b.to_pylist() if r["op"] not in (Tag.MARK, Tag.PREFIX)]  # only the fast path learns prefixes
    return sorted((r["offset"] or -1, r["op"], r["key"], r["change"], r["reason"]) for r in rows)


def run(changes: int, repeats: int, batch_records: int, out: Path) -> ParseResults:
    results = ParseResults(machine(), changes, repeats, batch_records)
    for shape in SHAPES:
        batches = record_batches(shape, changes, batch_records)
        value_bytes = sum(len(v) for b in batches for v in b.column("value").to_pylist())
        result = ShapeResult(shape, sum(b.num_rows for b in batches), value_bytes, {p: PathCost() for p in PATHS})
        say(f"{shape}: {result.records:,} records, {value_bytes / result.records:,.0f} bytes a value")
        # Both paths give the same rows (the property tests say so on random streams; here, on these).
        _, python_rows = _run_stage(shape, batches, False)
        _, fast_rows = _run_stage(shape, batches, True)
        if _changes(python_rows) != _changes(fast_rows):
            raise AssertionError(f"{shape}: the fast path's rows differ from the Python path's")
        for repeat in range(repeats):
            for path in PATHS:
                seconds, _ = _run_stage(shape, batches, path == "fast")
                result.paths[path].seconds.append(seconds)
            say(f"{shape} #{repeat + 1}: " + ", ".join(f"{p} {result.paths[p].seconds[-1]:.2f}s" for p in PATHS))
        results.shapes.append(result)
    publish(out, "parse", results, _plot, summary)
    return results


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def summary(results: ParseResults) -> str:
    rows = []
    for s in results.shapes:
        python = statistics.median(s.records_per_second("python"))
        for path in PATHS:
            fast = statistics.median(s.records_per_second(path))
            rows.append(
                [
                    s.shape,
                    f"{s.value_bytes / s.records:,.0f}",
                    path,
                    _spread(s.records_per_second(path)),
                    _spread(s.mb_per_second(path)),
                    f"{statistics.median(s.paths[path].seconds) / s.records * 1e6:.1f}",
                    f"{fast / python:.1f}x",
                ]
            )
    header = ["messages", "bytes/value", "path", "records/s (min-max)", "MB/s (min-max)", "µs/record", "vs Python"]
    return (
        f"Parse stage on one core, {results.changes:,} changes, Arrow batches of {results.batch_records:,} records, "
        f"medians of {results.repeats} runs ({results.machine})\n\n" + markdown_table(header, rows) + "\n"
    )


def _plot(results: ParseResults, path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.35
    for i, p in enumerate(PATHS):
        xs = [j + (i - 0.5) * width for j in range(len(results.shapes))]
        records = [statistics.median(s.records_per_second(p)) / 1000 for s in results.shapes]
        mbs = [statistics.median(s.mb_per_second(p)) for s in results.shapes]
        errors = [
            [r - min(s.records_per_second(p)) / 1000 for r, s in zip(records, results.shapes, strict=True)],
            [max(s.records_per_second(p)) / 1000 - r for r, s in zip(records, results.shapes, strict=True)],
        ]
        left.bar(xs, records, width, yerr=errors, label=p)
        right.bar(xs, mbs, width, label=p)
    for ax, title in ((left, "thousand records/s, one core (min-max)"), (right, "MB/s of Debezium JSON, one core")):
        ax.set_xticks(range(len(results.shapes)), [s.shape for s in results.shapes])
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser)  # as every benchmark's; this one runs in memory and keeps nothing there
    parser.add_argument("--changes", type=int, default=50_000, help="records of each message shape (default: 50000)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each path on each shape (default: 5)")
    parser.add_argument(
        "--batch-records",
        default="10000",
        metavar="N",
        help="records per Arrow batch, as Spark's maxRecordsPerBatch (default: 10000)",
    )
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    (batch_records,) = positive_integers(args.batch_records, "--batch-records")
    results = run(args.changes, args.repeats, batch_records, args.out)
    print_results(args.out, "parse", summary(results))
    return 0
