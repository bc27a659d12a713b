"""The table model every part shares, as plain picklable data: a table's columns with Iceberg
field ids, its primary key, its partition spec, and how to turn a canonical row (see
``icecdc.ingest.debezium``) into Arrow arrays and partition values. Built once from pyiceberg
metadata on the driver and shipped to the executors inside the batch functions' closures; the
compactor reads partitions, paths and keys through the same model.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote_plus

import pyarrow as pa
import pyarrow.json as pj

from icecdc.domain.jsonlines import json_lines
from icecdc.domain.sort_order import UNSORTED, SortOrder, sort_order_of
from icecdc.domain.tablespec import PartitionField, TableSpecError, decimal_type, parse_partition_field

EPOCH_DATE = dt.date(1970, 1, 1)

_ARROW_TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "string": pa.string(),
    "binary": pa.binary(),
}
# The Iceberg primitive types a table's columns may have, besides decimals.
PRIMITIVE_TYPES: tuple[str, ...] = tuple(_ARROW_TYPES)
# A partition tuple as it travels between stages and lands in commit events: one canonical
# value per partition field (transform results: ints for day/hour/bucket, the source value for
# identity), None for null.
PartitionKey = tuple[Any, ...]

# The Parquet field metadata key that carries a column's Iceberg field id.
FIELD_ID = b"PARQUET:field_id"


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # Iceberg type string, e.g. "long", "decimal(10, 2)"
    required: bool = False


def arrow_type(iceberg_type: str) -> pa.DataType:
    shape = decimal_type(iceberg_type)
    if shape is not None:
        return pa.decimal128(shape.precision, shape.scale)
    return _ARROW_TYPES[iceberg_type]


# Types whose canonical value is already the identity partition value.
_SELF_CANONICAL = frozenset({"string", "int", "long", "boolean", "date"})
# Day and hour of epoch microseconds are floor divisions (the spec's transforms, negatives too).
_MICROS_PER = {"day": 86_400_000_000, "hour": 3_600_000_000}


@functools.cache
def _transform_function(transform: str, source_type: str) -> Callable[[Any], Any]:
    # pyiceberg implements Iceberg's transforms exactly (bucket's murmur3 included); building the
    # function is the costly part, so it is built once per (transform, type) per process.
    from pydantic import TypeAdapter
    from pyiceberg.transforms import parse_transform
    from pyiceberg.types import PrimitiveType

    return parse_transform(transform).transform(TypeAdapter(PrimitiveType).validate_python(source_type))


def to_python(iceberg_type: str, value: Any) -> Any:
    """Canonical value -> the Python value pyarrow and pyiceberg's transforms take."""
    if value is None:
        return None
    if iceberg_type.startswith("decimal("):
        return decimal.Decimal(value)
    if iceberg_type == "binary":
        return base64.b64decode(value)
    return value


def _canonical(value: Any) -> Any:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return (value - EPOCH_DATE).days
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


@dataclass(frozen=True)
class PartitionTerm:
    name: str  # partition field name, e.g. updated_at_day
    source: str  # source column
    transform: str  # Iceberg's spelling: identity, day, bucket[16], ...
    source_type: str
    field_id: int = 0  # the partition field's id (1000 and up)

    def apply(self, canonical: Any) -> Any:
        """The partition value of a canonical source value, itself canonical (JSON-safe)."""
        if canonical is None:
            return None
        if self.transform == "identity" and self.source_type in _SELF_CANONICAL:
            return canonical  # the hot path of every record: no conversion to make
        if self.transform in _MICROS_PER and self.source_type in ("timestamp", "timestamptz"):
            return canonical // _MICROS_PER[self.transform]  # canonical timestamps are epoch micros
        result = _transform_function(self.transform, self.source_type)(to_python(self.source_type, canonical))
        if isinstance(result, decimal.Decimal):
            return str(result)
        if isinstance(result, bytes):
            return base64.b64encode(result).decode()
        return result

    @property
    def result_is_date(self) -> bool:
        return self.transform == "day" or (self.transform == "identity" and self.source_type == "date")

    def java_string(self, value: Any) -> str | None:
        """The string Iceberg's ``Conversions.fromPartitionString`` parses back to this value
        (used to build the Java partition tuple without py4j's int/long ambiguity)."""
        if value is None:
            return None
        if self.result_is_date:
            return (EPOCH_DATE + dt.timedelta(days=value)).isoformat()
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    def json_value(self, value: Any) -> Any:
        """The value in Iceberg's single-value JSON (dates as ISO strings, decimals as strings,
        binary as hex), as its content-file parser reads partition tuples."""
        if value is None or isinstance(value, bool):
            return value
        if self.result_is_date:
            return (EPOCH_DATE + dt.timedelta(days=value)).isoformat()
        if self.source_type == "binary" and not self.transform.startswith("bucket"):
            return base64.b64decode(value).hex()  # canonical binary is base64
        return value

    def human_string(self, value: Any) -> str:
        """The value as Iceberg writes it in partition paths (``Transform.toHumanString``):
        dates for days, ``2025-01-02-13`` for hours, ``2025-01`` for months, ``2025`` for years."""
        if self.transform in ("year", "month", "hour"):
            if self.transform == "year":
                return f"{1970 + value:04d}"
            if self.transform == "month":
                year, month = divmod(value, 12)
                return f"{1970 + year:04d}-{month + 1:02d}"
            days, hour = divmod(value, 24)
            return f"{(EPOCH_DATE + dt.timedelta(days=days)).isoformat()}-{hour:02d}"
        return self.java_string(value) or ""

    def path_segment(self, value: Any) -> str:
        return f"{self.name}={'null' if value is None else quote_plus(self.human_string(value))}"


# An older spec's partition is tracked as "(spec 0) region=eu": never a current-spec path.
_OLDER_SPEC = re.compile(r"^\(spec (\d+)\)(?: (.*))?$")


def older_spec_path(spec_id: int, path: str) -> str:
    """The tracked path of a partition (``path``) of the older spec ``spec_id``."""
    return f"(spec {spec_id}) {path}" if path else f"(spec {spec_id})"


def older_spec_of(tracked_path: str) -> int | None:
    """The older spec a tracked path names (None: a current-spec path)."""
    found = _OLDER_SPEC.match(tracked_path)
    return None if found is None else int(found.group(1))


@dataclass(frozen=True)
class OlderSpec:
    """A partition spec of the table other than its current one."""

    spec_id: int
    partition: tuple[PartitionTerm, ...]


@dataclass(frozen=True)
class TableLayout:
    table: str  # namespace.table, as in the config
    topic: str
    columns: tuple[Column, ...]
    field_ids: Mapping[str, int]
    primary_key: tuple[str, ...]
    partition: tuple[PartitionTerm, ...]
    spec_id: int
    data_location: str  # where data and delete files are written
    format_version: int = 2  # 3: position deletes are deletion vectors
    # A partition spec of the table without fields, where global equality deletes (applying to
    # every partition) are registered; None when the table has none yet, or is unpartitioned.
    global_spec_id: int | None = None
    # The table's declared sort order: compactions write their output sorted by it.
    sort_order: SortOrder = UNSORTED
    # The table's other partition specs (the global-delete one included), whose files the
    # compactor rewrites into the current spec.
    older_specs: tuple[OlderSpec, ...] = ()
    # Set on the layout of an older spec (``of_older_spec``): the current spec, which its
    # rewrites write into.
    output_spec_id: int | None = None
    # Data files of an older spec were live when the layout was read. A partitioned equality
    # delete applies only to data files of its own spec (Iceberg spec, "Scan Planning"), so the
    # ingester then writes every delete as a global delete, which applies to files of every spec,
    # until the sidecar has rewritten those files into the current spec and the layout is read again.
    older_spec_data: bool = False

    @property
    def is_older_spec(self) -> bool:
        return self.output_spec_id is not None

    @property
    def write_spec_id(self) -> int:
        """The spec a rewrite of this layout's partitions writes its files in."""
        return self.spec_id if self.output_spec_id is None else self.output_spec_id

    def of_older_spec(self, spec_id: int) -> TableLayout:
        """This table seen through one of its older specs: its partitions, and the current spec to
        write into."""
        older = next((s for s in self.older_specs if s.spec_id == spec_id), None)
        if older is None:
            raise ValueError(f"table {self.table} has no older partition spec {spec_id}")
        return replace(self, partition=older.partition, spec_id=spec_id, older_specs=(), output_spec_id=self.spec_id)

    def of_spec(self, spec_id: int) -> TableLayout | None:
        """This table seen through any of its specs (None: one whose source columns are gone)."""
        if spec_id == self.spec_id:
            return self
        return self.of_older_spec(spec_id) if any(s.spec_id == spec_id for s in self.older_specs) else None

    def for_path(self, path: str) -> TableLayout:
        """The layout a tracked partition's path is read with: an older spec's for its paths."""
        spec_id = older_spec_of(path)
        return self if spec_id is None else self.of_older_spec(spec_id)

    def tracked_path(self, partition: PartitionKey) -> str:
        """The path the compactor tracks a partition of this layout's spec by: an older spec's
        paths carry the spec id, so that they never meet the current spec's."""
        path = self.partition_path(partition)
        return path if self.output_spec_id is None else older_spec_path(self.spec_id, path)

    @property
    def append_only(self) -> bool:
        """Whether the ingester mirrors the table append-only: it has no primary key, so a change
        can only add a row (creates and snapshot reads), never replace or remove one."""
        return not self.primary_key

    @property
    def key_field_ids(self) -> list[int]:
        return [self.field_ids[name] for name in self.primary_key]

    def _arrow_field(self, column: Column) -> pa.Field:
        return pa.field(
            column.name,
            arrow_type(column.type),
            nullable=not column.required,
            metadata={FIELD_ID: str(self.field_ids[column.name]).encode()},
        )

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([self._arrow_field(c) for c in self.columns])

    def key_arrow_schema(self) -> pa.Schema:
        by_name = {c.name: c for c in self.columns}
        return pa.schema([self._arrow_field(by_name[name]) for name in self.primary_key])

    def partition_of(self, row: Mapping[str, Any]) -> PartitionKey | None:
        """The partition a row image belongs to; None when the image lacks a source column."""
        if any(term.source not in row for term in self.partition):
            return None
        return tuple(term.apply(row[term.source]) for term in self.partition)

    @property
    def key_determines_partition(self) -> bool:
        """Whether every partition source column is a key column (a row never changes partition)."""
        return all(term.source in self.primary_key for term in self.partition)

    def partition_from_key(self, key: Sequence[Any]) -> PartitionKey | None:
        """The partition, when every partition source column is part of the primary key."""
        return self.partition_of(dict(zip(self.primary_key, key, strict=True)))

    def partition_path(self, partition: PartitionKey) -> str:
        return "/".join(term.path_segment(value) for term, value in zip(self.partition, partition, strict=True))

    def partition_from_metadata(self, record: Mapping[str, Any]) -> PartitionKey:
        """The canonical partition of a pyiceberg metadata row (``inspect.files`` gives day
        partitions as dates, decimals as Decimals, binary as bytes)."""
        return tuple(_canonical(record.get(term.name)) for term in self.partition)

    def partition_java_strings(self, partition: PartitionKey) -> list[str | None]:
        return [term.java_string(value) for term, value in zip(self.partition, partition, strict=True)]

    def partition_json(self, partition: PartitionKey) -> dict[str, Any]:
        """The partition tuple as Iceberg's content-file JSON has it: partition field id -> value."""
        return {str(term.field_id): term.json_value(value) for term, value in zip(self.partition, partition, strict=True)}

    def partition_record(self, partition: PartitionKey) -> dict[str, Any]:
        """The partition as a JSON object for commit events: field name -> value."""
        return {term.name: value for term, value in zip(self.partition, partition, strict=True)}

    def to_arrow(self, rows: Sequence[Mapping[str, Any]], key_only: bool = False) -> pa.Table:
        schema = self.key_arrow_schema() if key_only else self.arrow_schema()
        by_name = {c.name: c for c in self.columns}
        arrays = []
        for f in schema:
            values = [row.get(f.name) for row in rows]
            if pa.types.is_decimal(f.type):
                # Canonical decimals are exact strings: Arrow parses them in C++, no Decimal objects.
                arrays.append(pa.array(values, pa.string()).cast(f.type))
            elif pa.types.is_binary(f.type):
                arrays.append(pa.array([to_python(by_name[f.name].type, v) for v in values], f.type))
            else:
                arrays.append(pa.array(values, f.type))
        return pa.Table.from_arrays(arrays, schema=schema)

    def arrow_from_json(self, images: pa.Array, key_only: bool = False) -> pa.Table:
        """``to_arrow`` of canonical rows given as JSON objects, one per value of ``images`` (none
        null), read by Arrow's JSON reader: no Python object per row but for binary values."""
        schema = self.key_arrow_schema() if key_only else self.arrow_schema()
        if not len(images):
            return schema.empty_table()
        read = pa.schema([(f.name, _json_read_type(f.type)) for f in schema])
        lines = json_lines(images)
        table = pj.read_json(
            pa.BufferReader(lines),
            # Blocks of a quarter: the reader parses them on Arrow's threads.
            read_options=pj.ReadOptions(block_size=max(1 << 18, lines.size // 4 + 1)),
            parse_options=pj.ParseOptions(explicit_schema=read, unexpected_field_behavior="ignore"),
        )
        by_name = {c.name: c for c in self.columns}
        arrays = []
        for f in schema:
            values = table.column(f.name)
            if pa.types.is_binary(f.type):
                values = pa.array([to_python(by_name[f.name].type, v) for v in values.to_pylist()], f.type)
            elif values.type != f.type:
                # Canonical ints (days, microseconds) and decimal text cast exactly; a float
                # column's float32 is rounded as ``pa.array`` rounds a Python float.
                values = values.cast(f.type, safe=not pa.types.is_floating(f.type))
            arrays.append(values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)
        return pa.Table.from_arrays(arrays, schema=schema)


# How Arrow's JSON reader reads the canonical values of the Arrow types it does not read as is.
_JSON_READ_TYPES: dict[pa.DataType, pa.DataType] = {
    pa.int32(): pa.int64(),
    pa.float32(): pa.float64(),
    pa.date32(): pa.int32(),
    pa.timestamp("us"): pa.int64(),
    pa.timestamp("us", tz="UTC"): pa.int64(),
    pa.binary(): pa.string(),
}


def _json_read_type(arrow: pa.DataType) -> pa.DataType:
    return pa.string() if pa.types.is_decimal(arrow) else _JSON_READ_TYPES.get(arrow, arrow)


def layout_from_pyiceberg(table_name: str, topic: str, primary_key: Sequence[str], table: Any) -> TableLayout:
    """Build the layout from a pyiceberg ``Table`` (metadata only)."""
    schema = table.schema()
    spec = table.spec()
    columns = tuple(Column(f.name, str(f.field_type), f.required) for f in schema.fields)
    missing = [k for k in primary_key if k not in {c.name for c in columns}]
    if missing:
        raise TableSpecError(f"table {table_name} has no column(s) {missing} of its configured primary key")
    types = {c.name: c.type for c in columns}
    for field in spec.fields:
        # The same rules as for configured tables: an existing table partitioned in a way the
        # ingester cannot write (identity on a timestamp) is refused up front, with the reason.
        term = PartitionField.from_iceberg(schema.find_column_name(field.source_id), str(field.transform))
        try:
            parse_partition_field(str(term), types)
        except TableSpecError as exc:
            raise TableSpecError(f"table {table_name}: {exc}") from None
    partition = _partition_terms(schema, spec, types)
    if partition is None:
        raise TableSpecError(f"table {table_name}: a partition field's source column is not in the schema")
    location = table.properties.get("write.data.path") or f"{table.location().rstrip('/')}/data"
    unpartitioned = sorted(i for i, s in table.specs().items() if s.is_unpartitioned()) if spec.fields else []
    return TableLayout(
        table=table_name,
        topic=topic,
        columns=columns,
        field_ids={f.name: f.field_id for f in schema.fields},
        primary_key=tuple(primary_key),
        partition=partition,
        spec_id=spec.spec_id,
        data_location=location,
        format_version=int(table.metadata.format_version),
        global_spec_id=unpartitioned[0] if unpartitioned else None,
        sort_order=sort_order_from_pyiceberg(schema, table.sort_order()),
        older_specs=tuple(
            OlderSpec(spec_id, terms)
            for spec_id, other in sorted(table.specs().items())
            if spec_id != spec.spec_id and (terms := _partition_terms(schema, other, types)) is not None
        ),
    )


def _partition_terms(schema: Any, spec: Any, types: Mapping[str, str]) -> tuple[PartitionTerm, ...] | None:
    """A pyiceberg spec's fields as partition terms; None when one's source column is gone from
    the schema (an older spec's files are then left as they are)."""
    names = [schema.find_column_name(f.source_id) for f in spec.fields]
    if any(name is None or name not in types for name in names):
        return None
    return tuple(
        PartitionTerm(f.name, name, str(f.transform), types[name], f.field_id) for f, name in zip(spec.fields, names, strict=True)
    )


def sort_order_from_pyiceberg(schema: Any, order: Any) -> SortOrder:
    """A pyiceberg ``SortOrder`` of ``schema`` as plain data, each field named by its source
    column's current name (None when that column was dropped)."""
    return sort_order_of(
        order.order_id,
        ((schema.find_column_name(f.source_id), str(f.transform), f.direction.value, f.null_order.value) for f in order.fields),
    )
