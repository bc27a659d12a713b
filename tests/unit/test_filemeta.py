"""The content-file JSON the ingester registers its files with: column metrics as the table's
``write.metadata.metrics.*`` properties ask, read from the footer pyarrow wrote."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from icecdc.domain.layout import Column, PartitionTerm, TableLayout, metrics_properties
from icecdc.ingest.filemeta import FileKind, describe
from icecdc.runtime.fileio import write_parquet_with_footer

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType()),
    NestedField(3, "note", StringType()),
)


@pytest.fixture
def layout(tmp_path):
    return TableLayout(
        "db.t",
        "t",
        (Column("id", "long", True), Column("region", "string"), Column("note", "string")),
        {"id": 1, "region": 2, "note": 3},
        ("id",),
        (PartitionTerm("region", "region", "identity", "string", 1000),),
        0,
        str(tmp_path),
        schema_json=SCHEMA.model_dump_json(),
    )


def described(layout: TableLayout, kind: FileKind, path: str) -> dict:
    rows = [{"id": 7, "region": "eu", "note": "x" * 40}, {"id": 3, "region": "eu", "note": "short"}]
    arrow = layout.to_arrow(rows, key_only=kind != FileKind.DATA)
    size, footer = write_parquet_with_footer(arrow, path, {})
    return orjson.loads(describe(layout, kind, path, ("eu",), size, footer))


def test_without_metrics_properties_every_column_gets_bounds_truncated_to_16(layout, tmp_path):
    document = described(layout, FileKind.DATA, f"{tmp_path}/a.parquet")
    assert document["lower-bounds"]["keys"] == [1, 2, 3]
    note_upper = bytes.fromhex(document["upper-bounds"]["values"][2])
    assert len(note_upper) == 16  # truncate(16): "x" * 15 then one byte up
    assert document["record-count"] == 2


def test_the_tables_metrics_modes_decide_which_columns_get_which_metrics(layout, tmp_path):
    modes = {
        "write.metadata.metrics.default": "counts",
        "write.metadata.metrics.column.id": "full",
        "write.metadata.metrics.column.note": "none",
        "write.format.default": "parquet",  # not a metrics property: left out
    }
    layout = replace(layout, metrics_properties=metrics_properties(modes))
    assert [k for k, _ in layout.metrics_properties] == [
        "write.metadata.metrics.column.id",
        "write.metadata.metrics.column.note",
        "write.metadata.metrics.default",
    ]
    document = described(layout, FileKind.DATA, f"{tmp_path}/b.parquet")
    assert document["lower-bounds"]["keys"] == [1]  # id full; region counts only; note none
    assert document["upper-bounds"]["keys"] == [1]
    assert document["value-counts"]["keys"] == [1, 2]  # note: no metrics at all
    assert document["null-value-counts"]["keys"] == [1, 2]


def test_equality_deletes_follow_the_key_columns_modes(layout, tmp_path):
    layout = replace(layout, metrics_properties=metrics_properties({"write.metadata.metrics.default": "none"}))
    document = described(layout, FileKind.DELETE, f"{tmp_path}/c.parquet")
    assert document["content"] == "EQUALITY_DELETES"
    assert document["equality-ids"] == [1]
    assert document["lower-bounds"]["keys"] == []
    assert document["record-count"] == 2


def test_a_tables_layout_carries_its_metrics_properties(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    from icecdc.domain.layout import layout_from_pyiceberg

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    table = catalog.create_table(
        "db.t", SCHEMA, properties={"write.metadata.metrics.column.note": "none", "commit.retry.num-retries": "9"}
    )
    layout = layout_from_pyiceberg("db.t", "t", ("id",), table)
    assert layout.metrics_properties == (("write.metadata.metrics.column.note", "none"),)
