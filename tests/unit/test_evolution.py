"""Source schema changes against a table's columns, without Spark: what the Connect schema wrapper
says, what Iceberg can make of it, and what it cannot."""

from __future__ import annotations

import pytest

from icecdc.domain.layout import Column
from icecdc.ingest.evolution import (
    ChangeKind,
    ColumnChange,
    Incompatible,
    compare,
    connect_type,
    inferred_changes,
    merge_changes,
    reconcile,
    source_fields,
)

COLUMNS = (Column("id", "int", True), Column("amount", "decimal(10, 2)"), Column("name", "string"), Column("at", "timestamp"))


def envelope(*fields: dict) -> dict:
    """A Connect schema of a Debezium envelope whose before and after structs list ``fields``."""
    row = {"type": "struct", "optional": True, "fields": list(fields)}
    return {"type": "struct", "name": "shop.public.t.Envelope", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ({"type": "int16"}, "int"),
        ({"type": "int64"}, "long"),
        ({"type": "float32"}, "float"),
        # What Connect's JsonConverter writes for FLOAT32 and FLOAT64 (PostgreSQL's real, double precision).
        ({"type": "float"}, "float"),
        ({"type": "double"}, "double"),
        ({"type": "bytes"}, "binary"),
        ({"type": "int64", "name": "io.debezium.time.MicroTimestamp"}, "timestamp"),
        ({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, "timestamptz"),
        ({"type": "int32", "name": "io.debezium.time.Date"}, "date"),
        ({"type": "int64", "name": "io.debezium.time.MicroTime"}, "long"),
        ({"type": "string", "name": "io.debezium.data.Uuid"}, "string"),
        ({"type": "string", "name": "io.debezium.data.Json"}, "string"),
        ({"type": "bytes", "name": "io.debezium.data.Bits", "parameters": {"length": "3"}}, "binary"),
        (
            {
                "type": "bytes",
                "name": "org.apache.kafka.connect.data.Decimal",
                "parameters": {"scale": "2", "connect.decimal.precision": "12"},
            },
            "decimal(12, 2)",
        ),
        ({"type": "struct", "name": "io.debezium.data.geometry.Point", "fields": []}, None),
        ({"type": "array", "items": {"type": "int32"}}, None),
    ],
)
def test_connect_types_map_to_iceberg_types(field, expected):
    assert connect_type(field) == expected


def test_a_new_field_becomes_an_optional_column_and_a_wider_type_widens():
    schema = envelope(
        {"field": "id", "type": "int64"},
        {
            "field": "amount",
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "14"},
        },
        {"field": "name", "type": "string"},
        {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        {"field": "note", "type": "string", "optional": True},
        {"field": "where", "type": "struct", "fields": []},
    )
    found = compare(COLUMNS, source_fields(schema))
    assert set(found.changes) == {
        ColumnChange(ChangeKind.WIDEN, "id", "long"),
        ColumnChange(ChangeKind.WIDEN, "amount", "decimal(14, 2)"),
        ColumnChange(ChangeKind.ADD, "note", "string"),
    }
    assert found.unknown == ("where",) and found.incompatible == ()


def test_a_narrower_source_type_changes_nothing_and_an_incompatible_one_is_refused():
    narrow = compare((Column("id", "long"), Column("ratio", "double")), (("id", "int"), ("ratio", "float")))
    assert narrow.changes == () and narrow.incompatible == ()
    refused = compare(COLUMNS, (("name", "long"), ("amount", "boolean")))
    assert len(refused.incompatible) == 2 and "column 'name' is string in the table" in refused.incompatible[0]
    with pytest.raises(Incompatible):
        reconcile("long", "int-not-a-type")


@pytest.mark.parametrize(
    ("table", "source"),
    [
        ("decimal(10, 2)", "string"),  # decimal.handling.mode=string
        ("decimal(10, 2)", "double"),  # decimal.handling.mode=double
        ("decimal(10, 2)", "decimal(8, 2)"),
        ("decimal(10, 2)", "variable-decimal"),
        ("timestamptz", "timestamp"),
        ("timestamp", "long"),  # epoch integers without a logical type
        ("date", "string"),
        ("long", "int"),
    ],
)
def test_encodings_the_column_decodes_need_no_change(table, source):
    assert reconcile(table, source) is None


def test_one_change_per_column_the_widest():
    merged = merge_changes(
        [
            ColumnChange(ChangeKind.ADD, "n", "int"),
            ColumnChange(ChangeKind.ADD, "n", "long"),
            ColumnChange(ChangeKind.ADD, "m", "string"),
        ]
    )
    assert merged == [ColumnChange(ChangeKind.ADD, "m", "string"), ColumnChange(ChangeKind.ADD, "n", "long")]


def test_without_a_schema_new_columns_are_typed_from_json_values():
    row = {"id": 1, "note": "x", "score": 1.5, "flag": True, "count": 3, "later": None, "nested": {"a": 1}}
    assert set(inferred_changes(COLUMNS, row)) == {
        ColumnChange(ChangeKind.ADD, "note", "string"),
        ColumnChange(ChangeKind.ADD, "score", "double"),
        ColumnChange(ChangeKind.ADD, "flag", "boolean"),
        ColumnChange(ChangeKind.ADD, "count", "long"),
    }
