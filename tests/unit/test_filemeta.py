"""The content-file JSON the ingester registers its files with: what the writer knows (spec,
partition, size, record count, equality ids) and the footer pyarrow wrote, from which the JVM
computes the column metrics with Iceberg's own code (the integration test
``test_file_metrics_described_on_executors_equal_icebergs_own`` checks them against Iceberg's
reader, with the table's metrics modes)."""

from __future__ import annotations

import base64
import io
from dataclasses import replace

import orjson
import pyarrow.parquet as pq
import pytest

from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.ingest.batch_files import SNAPPY_MAX_ROWS, write_file
from icecdc.ingest.filemeta import FOOTER_FIELD, FileKind, describe, parquet_footer
from icecdc.runtime.fileio import write_new_parquet


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
        global_spec_id=4,
    )


def written(layout: TableLayout, kind: FileKind, path: str) -> tuple[bytes, dict]:
    rows = [{"id": 7, "region": "eu", "note": "x" * 40}, {"id": 3, "region": "eu", "note": "short"}]
    arrow = layout.to_arrow(rows, key_only=kind != FileKind.DATA)
    data = write_new_parquet(arrow, path, {})
    return data, orjson.loads(describe(layout, kind, path, ("eu",), len(data), arrow.num_rows, parquet_footer(data)))


def test_the_footer_is_the_files_own_as_parquet_frames_it(layout, tmp_path):
    data, document = written(layout, FileKind.DATA, f"{tmp_path}/a.parquet")
    footer = base64.b64decode(document[FOOTER_FIELD])
    assert data.endswith(footer + len(footer).to_bytes(4, "little") + b"PAR1")
    # Framed on its own, the footer reads as the file's metadata: two rows, the fields' ids.
    alone = pq.read_metadata(io.BytesIO(b"PAR1" + footer + len(footer).to_bytes(4, "little") + b"PAR1"))
    assert alone.num_rows == 2
    assert alone.schema.to_arrow_schema().field("id").metadata[b"PARQUET:field_id"] == b"1"


def test_a_data_file_names_its_spec_partition_size_and_rows_and_leaves_metrics_to_the_jvm(layout, tmp_path):
    data, document = written(layout, FileKind.DATA, f"{tmp_path}/a.parquet")
    assert document["spec-id"] == 0 and document["content"] == "DATA"
    assert document["file-size-in-bytes"] == len(data) and document["record-count"] == 2
    assert document["partition"] == layout.partition_json(("eu",))
    assert "equality-ids" not in document
    assert not {"lower-bounds", "upper-bounds", "value-counts"} & set(document)


def test_equality_deletes_name_the_key_and_global_ones_the_unpartitioned_spec(layout, tmp_path):
    _, partitioned = written(layout, FileKind.DELETE, f"{tmp_path}/c.parquet")
    assert partitioned["content"] == "EQUALITY_DELETES" and partitioned["equality-ids"] == [1]
    assert partitioned["spec-id"] == 0 and "partition" in partitioned
    _, everywhere = written(layout, FileKind.GLOBAL_DELETE, f"{tmp_path}/d.parquet")
    assert everywhere["spec-id"] == 4 and "partition" not in everywhere
    with pytest.raises(ValueError, match="no unpartitioned spec"):
        written(replace(layout, global_spec_id=None), FileKind.GLOBAL_DELETE, f"{tmp_path}/e.parquet")


@pytest.mark.parametrize(
    "data", [b"", b"PAR1", b"PAR1 not a footer", b"PAR1" + b"\x00" * 4 + (99).to_bytes(4, "little") + b"PAR1"]
)
def test_bytes_that_are_no_whole_parquet_file_have_no_footer(data):
    with pytest.raises(ValueError, match="not a whole Parquet file"):
        parquet_footer(data)


@pytest.mark.parametrize(
    ("rows", "codec"), [(1, "SNAPPY"), (SNAPPY_MAX_ROWS, "SNAPPY"), (SNAPPY_MAX_ROWS + 1, "ZSTD"), (500, "ZSTD")]
)
def test_a_batch_s_file_is_written_plain_small_ones_under_snappy_and_described_as_written(layout, rows, codec):
    records = [{"id": i, "region": "eu", "note": "same note"} for i in range(rows)]
    fact = write_file(layout, FileKind.DATA, ("eu",), layout.to_arrow(records), {}, "test-0")
    columns = pq.ParquetFile(fact["path"]).metadata.row_group(0)
    assert not any(columns.column(i).has_dictionary_page for i in range(columns.num_columns))
    assert {columns.column(i).compression for i in range(columns.num_columns)} == {codec}
    assert fact["record_count"] == rows and pq.read_table(fact["path"]).num_rows == rows
    assert orjson.loads(fact["description"])["file-size-in-bytes"] == fact["file_size"]
