"""Schema changes in the source, kept pure: what a record's Connect schema (the JsonConverter's
schema wrapper) says about its columns, against the table's, and what the table must become to
take it. Iceberg makes a change only where no value can be lost: a new column (optional), a
widening it allows (``int`` to ``long``, ``float`` to ``double``, a decimal's precision up at
the same scale); a narrower source type is written as it is (its values fit); anything else is
incompatible, and the records that need it go to the dead-letter topic.

Columns are never dropped: a field the source stops sending is written as null.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from icecdc.domain.layout import Column
from icecdc.domain.tablespec import DecimalType, decimal_type, widens_to

# Connect's primitive types -> Iceberg's. The JsonConverter spells FLOAT32 and FLOAT64 "float"
# and "double" in the schemas it writes; the Connect names are kept for other writers.
_CONNECT_PRIMITIVES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float": "float",
    "double": "double",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
}
# Debezium's and Connect's logical types -> Iceberg's (docs/ingest.md, "Values"). A time of day
# is a long (microseconds since midnight): Spark cannot read Iceberg's ``time``.
_CONNECT_LOGICAL = {
    "io.debezium.time.Date": "date",
    "org.apache.kafka.connect.data.Date": "date",
    "io.debezium.time.IsoDate": "date",
    "io.debezium.time.Timestamp": "timestamp",
    "io.debezium.time.MicroTimestamp": "timestamp",
    "io.debezium.time.NanoTimestamp": "timestamp",
    "org.apache.kafka.connect.data.Timestamp": "timestamp",
    "io.debezium.time.IsoTimestamp": "timestamp",
    "io.debezium.time.ZonedTimestamp": "timestamptz",
    "io.debezium.time.Time": "long",
    "io.debezium.time.MicroTime": "long",
    "io.debezium.time.NanoTime": "long",
    "org.apache.kafka.connect.data.Time": "long",
    "io.debezium.time.ZonedTime": "string",
    "io.debezium.time.IsoTime": "string",
    "io.debezium.time.Year": "int",
    "io.debezium.time.MicroDuration": "long",
    "io.debezium.time.Interval": "string",
    "io.debezium.data.Uuid": "string",
    "io.debezium.data.Json": "string",
    "io.debezium.data.Xml": "string",
    "io.debezium.data.Enum": "string",
    "io.debezium.data.EnumSet": "string",
    "io.debezium.data.Bits": "binary",
    # No precision or scale of its own: a new column holds its exact text.
    "io.debezium.data.VariableScaleDecimal": "string",
}
CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"


def connect_type(field: Mapping[str, Any]) -> str | None:
    """The Iceberg type of a Connect field schema; None for what has no column type (structs,
    arrays, maps, unknown types)."""
    name = field.get("name")
    if name == CONNECT_DECIMAL:
        parameters = field.get("parameters") or {}
        try:
            scale = int(parameters.get("scale", 0))
            precision = int(parameters.get("connect.decimal.precision", 38))
        except (TypeError, ValueError):
            return None
        return str(DecimalType(min(precision, 38), scale)) if 0 <= scale <= precision else None
    if isinstance(name, str) and name in _CONNECT_LOGICAL:
        return _CONNECT_LOGICAL[name]
    kind = field.get("type")
    return _CONNECT_PRIMITIVES.get(kind) if isinstance(kind, str) else None


def json_type(value: Any) -> str | None:
    """The Iceberg type a bare JSON value suggests (``infer_new_columns``); None for null and for
    objects and arrays."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    return None


class ChangeKind(str, enum.Enum):
    ADD = "add"  # a new optional column
    WIDEN = "widen"  # a column's type, widened as Iceberg allows


@dataclass(frozen=True, order=True)
class ColumnChange:
    kind: ChangeKind
    column: str
    iceberg_type: str

    def __str__(self) -> str:
        verb = "add column" if self.kind is ChangeKind.ADD else "widen column"
        return f"{verb} {self.column} {self.iceberg_type}"


class Incompatible(Exception):
    """A source type the table's column cannot take and Iceberg cannot change it to."""


def _category(kind: str) -> str:
    if kind in ("int", "long"):
        return "integer"
    if kind in ("float", "double"):
        return "floating"
    if kind in ("timestamp", "timestamptz"):
        return "timestamp"
    if kind == "variable-decimal" or decimal_type(kind):
        return "decimal"
    return kind  # string, binary, boolean, date


# Column category -> the source categories whose values it can take (each value is still checked
# when decoded, as it is without a schema): a decimal column takes decimals sent as strings or
# doubles (Debezium's decimal.handling.mode), a timestamp column epoch integers and ISO text.
_TAKES = {
    "integer": {"integer"},
    "floating": {"integer", "floating", "decimal"},
    "decimal": {"integer", "floating", "decimal", "string"},
    "string": {"string"},
    "binary": {"binary"},
    "boolean": {"boolean"},
    "date": {"date", "integer", "string"},
    "timestamp": {"timestamp", "integer", "string"},
}


def reconcile(table_type: str, source_type: str) -> str | None:
    """The type ``table_type`` must be widened to for values of ``source_type``; None when it
    takes them as it is. Raises Incompatible when Iceberg cannot make it take them."""
    if table_type == source_type:
        return None
    if widens_to(table_type, source_type):
        return source_type
    if _category(source_type) in _TAKES.get(_category(table_type), set()) or (
        table_type == "string" and source_type == "variable-decimal"
    ):
        return None
    raise Incompatible(f"Iceberg cannot change {table_type} to {source_type}")


@dataclass(frozen=True)
class SourceSchema:
    """What one record's Connect schema says about the table's columns."""

    changes: tuple[ColumnChange, ...] = ()  # what the table must become
    incompatible: tuple[str, ...] = ()  # why the record cannot be written, one line per column
    unknown: tuple[str, ...] = ()  # fields with no column type (structs, arrays, ...): not added


def source_fields(schema: Any) -> tuple[tuple[str, str | None], ...]:
    """(field, Iceberg type) of the row struct of an envelope's Connect schema, from its after
    (or before) struct; empty without a schema."""
    if not isinstance(schema, Mapping):
        return ()
    images = {f.get("field"): f for f in schema.get("fields") or () if isinstance(f, Mapping)}
    image = images.get("after") or images.get("before")
    if not isinstance(image, Mapping):
        return ()
    out = []
    for field in image.get("fields") or ():
        if isinstance(field, Mapping) and isinstance(field.get("field"), str):
            kind = "variable-decimal" if field.get("name") == "io.debezium.data.VariableScaleDecimal" else connect_type(field)
            out.append((field["field"], kind))
    return tuple(out)


@functools.lru_cache(maxsize=256)
def compare(columns: tuple[Column, ...], fields: tuple[tuple[str, str | None], ...]) -> SourceSchema:
    """A record's source fields against the table's columns (cached: a topic's records share a
    handful of schemas)."""
    by_name = {c.name: c for c in columns}
    changes, incompatible, unknown = [], [], []
    for name, kind in fields:
        column = by_name.get(name)
        if kind is None:
            if column is None:
                unknown.append(name)
            continue
        if column is None:
            changes.append(ColumnChange(ChangeKind.ADD, name, "string" if kind == "variable-decimal" else kind))
            continue
        try:
            wider = reconcile(column.type, kind)
        except Incompatible as why:
            incompatible.append(f"column {name!r} is {column.type} in the table, the source now sends {kind}: {why}")
            continue
        if wider is not None:
            changes.append(ColumnChange(ChangeKind.WIDEN, name, wider))
    return SourceSchema(tuple(changes), tuple(incompatible), tuple(unknown))


def inferred_changes(columns: Sequence[Column], row: Mapping[str, Any]) -> tuple[ColumnChange, ...]:
    """New columns for the fields of a bare after-image the table lacks, typed from their JSON
    values (``infer_new_columns``); fields whose value is null or nested wait for a typed value."""
    names = {c.name for c in columns}
    out = []
    for name, value in row.items():
        kind = json_type(value) if name not in names else None
        if kind is not None:
            out.append(ColumnChange(ChangeKind.ADD, name, kind))
    return tuple(out)


def merge_changes(changes: Iterable[ColumnChange]) -> list[ColumnChange]:
    """One change per column: the widest type asked for (several records of one batch may ask
    for a column with different types); a column added and widened in one batch is added wide."""
    by_column: dict[str, ColumnChange] = {}
    for change in sorted(changes):
        earlier = by_column.get(change.column)
        if earlier is None:
            by_column[change.column] = change
            continue
        try:
            wider = reconcile(earlier.iceberg_type, change.iceberg_type)
        except Incompatible:
            continue  # the first type wins; the other records are refused when the batch is redone
        if wider is not None:
            by_column[change.column] = ColumnChange(earlier.kind, change.column, wider)
    return sorted(by_column.values(), key=lambda c: c.column)
